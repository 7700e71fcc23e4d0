// engine/unicode_nfc.h — Unicode Normalization Form C as Hugging Face's
// `tokenizers` applies it (the normalizer of Qwen2-family tokenizer.json
// files). ICU does the work, limited to the code points of Unicode 9.0: the
// tables `tokenizers` normalises with. A mark assigned later is left where
// it stands there (a character it does not know), so it is here too.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace baton::engine {

// Whether ICU's normaliser could be set up; the tokenizer loader refuses an
// NFC normalizer otherwise.
Status nfc_available();

// text in NFC. Bytes that are not well-formed UTF-8 are kept as they are and
// the valid runs between them normalised.
std::string to_nfc(std::string_view text);

}  // namespace baton::engine

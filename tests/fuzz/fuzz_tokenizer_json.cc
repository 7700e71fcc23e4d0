// libFuzzer target: a checkpoint's tokenizer.json. Loading gives a tokenizer
// or an error naming the file; a tokenizer that loads encodes text (with
// its special tokens) into ids inside its vocabulary, and decodes them.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "engine/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using nlohmann::json;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  auto tokenizer = baton::engine::load_hf_tokenizer(doc, json(), "tokenizer.json");
  if (!tokenizer.is_ok()) return 0;
  const auto ids = (*tokenizer)->encode("Hello, world! 123 <s>\xe4\xb8\xad\xff e\xcc\x81");
  for (int32_t id : ids) {
    if (id < 0 || id >= (*tokenizer)->vocab_size()) std::abort();
  }
  (void)(*tokenizer)->decode(ids);
  return 0;
}

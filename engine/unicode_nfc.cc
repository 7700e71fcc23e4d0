#include "engine/unicode_nfc.h"

#include <unicode/normalizer2.h>
#include <unicode/uniset.h>
#include <unicode/unistr.h>

#include <memory>

#include "engine/utf8.h"

namespace baton::engine {
namespace {

// The Unicode version of the normalisation tables `tokenizers` carries.
constexpr char16_t kKnownCodePoints[] = u"[:age=9.0:]";

struct Normalizer {
  std::unique_ptr<icu::UnicodeSet> known;
  std::unique_ptr<icu::FilteredNormalizer2> nfc;
};

// Made once; null when ICU cannot provide it.
const Normalizer* normalizer() {
  static const std::unique_ptr<Normalizer> instance = []() -> std::unique_ptr<Normalizer> {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
    if (U_FAILURE(status) || nfc == nullptr) return nullptr;
    auto n = std::make_unique<Normalizer>();
    n->known = std::make_unique<icu::UnicodeSet>(icu::UnicodeString(kKnownCodePoints), status);
    if (U_FAILURE(status)) return nullptr;
    n->known->freeze();
    n->nfc = std::make_unique<icu::FilteredNormalizer2>(*nfc, *n->known);
    return n;
  }();
  return instance.get();
}

// Code points below U+0300 neither decompose nor compose with one another:
// text made only of them is already NFC.
bool maybe_changes(std::string_view run) {
  for (size_t i = 0; i < run.size();) {
    const size_t n = utf8::length_at(run, i);
    if (utf8::decode_at(run, i, n) >= 0x300) return true;
    i += n;
  }
  return false;
}

void append_nfc(const Normalizer& n, std::string_view run, std::string& out) {
  if (run.empty()) return;
  if (!maybe_changes(run)) {
    out.append(run);
    return;
  }
  UErrorCode status = U_ZERO_ERROR;
  const icu::UnicodeString text =
      icu::UnicodeString::fromUTF8(icu::StringPiece(run.data(), int32_t(run.size())));
  const icu::Normalizer2& nfc = *n.nfc;  // the overload returning a string is the base's
  const icu::UnicodeString normalized = nfc.normalize(text, status);
  if (U_FAILURE(status)) {
    out.append(run);
    return;
  }
  normalized.toUTF8String(out);
}

}  // namespace

Status nfc_available() {
  if (normalizer() != nullptr) return Status::ok();
  return unimplemented("ICU's NFC normalizer could not be set up");
}

std::string to_nfc(std::string_view text) {
  const Normalizer* n = normalizer();
  if (n == nullptr) return std::string(text);
  std::string out;
  out.reserve(text.size());
  size_t run_begin = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t length = utf8::length_at(text, i);
    if (length == 1 && static_cast<unsigned char>(text[i]) >= 0x80) {
      append_nfc(*n, text.substr(run_begin, i - run_begin), out);
      out += text[i];
      run_begin = i + 1;
    }
    i += length;
  }
  append_nfc(*n, text.substr(run_begin), out);
  return out;
}

}  // namespace baton::engine

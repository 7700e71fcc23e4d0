#include "engine/pcre2_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace baton::engine {

struct Pcre2Regex::Impl {
  pcre2_code* code = nullptr;
  ~Impl() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

Pcre2Regex::Pcre2Regex(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pcre2Regex::Pcre2Regex(Pcre2Regex&&) noexcept = default;
Pcre2Regex& Pcre2Regex::operator=(Pcre2Regex&&) noexcept = default;
Pcre2Regex::~Pcre2Regex() = default;

Result<Pcre2Regex> Pcre2Regex::compile(std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  auto impl = std::make_unique<Impl>();
  impl->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (impl->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    return invalid_argument("regex '" + std::string(pattern) + "' at offset " +
                            std::to_string(offset) + ": " + reinterpret_cast<const char*>(message));
  }
  // The JIT is a speed-up only; without it the interpreter matches the same.
  (void)pcre2_jit_compile(impl->code, PCRE2_JIT_COMPLETE);
  return Pcre2Regex(std::move(impl));
}

Result<Pcre2Regex> Pcre2Regex::literal(std::string_view literal) {
  return compile("\\Q" + std::string(literal) + "\\E");
}

bool Pcre2Regex::for_each_match(
    std::string_view text, const std::function<bool(size_t begin, size_t end)>& on_match) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(impl_->code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), start, 0, data.get(), nullptr);
    if (rc < 0) break;  // no match (or an error: treat the rest as unmatched)
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      if (!on_match(begin, end)) return false;
      start = end;
    } else {
      // An empty match: step over one whole UTF-8 character.
      start = end + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
        ++start;
      }
    }
  }
  return true;
}

}  // namespace baton::engine

// engine/pcre2_regex.h — a compiled PCRE2 pattern over UTF-8 text, with
// Unicode properties (\p{L}, \s as Unicode white space) and the JIT where
// the platform has it. Invalid UTF-8 in the subject is matched around
// rather than refused.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace baton::engine {

class Pcre2Regex {
 public:
  // `pattern` in PCRE2 syntax; a pattern PCRE2 refuses is InvalidArgument
  // with its message and offset.
  static Result<Pcre2Regex> compile(std::string_view pattern);
  // A pattern matching `literal` exactly.
  static Result<Pcre2Regex> literal(std::string_view literal);

  Pcre2Regex(Pcre2Regex&&) noexcept;
  Pcre2Regex& operator=(Pcre2Regex&&) noexcept;
  ~Pcre2Regex();

  // Each non-overlapping match in `text`, as [begin, end) byte offsets, left
  // to right (an empty match advances by one character), handed to
  // `on_match` until it returns false; false when it stopped early.
  bool for_each_match(std::string_view text,
                      const std::function<bool(size_t begin, size_t end)>& on_match) const;

 private:
  struct Impl;
  explicit Pcre2Regex(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton::engine

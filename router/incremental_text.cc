#include "router/incremental_text.h"

namespace baton::router {

bool append_decoded(const std::vector<int32_t>& tokens, size_t& decoded, std::string& text,
                    const DecodeFn& decode) {
  if (decoded >= tokens.size()) return true;
  const size_t start = decoded > kDetokenizeContextTokens ? decoded - kDetokenizeContextTokens : 0;
  const std::vector<int32_t> context(tokens.begin() + ptrdiff_t(start),
                                     tokens.begin() + ptrdiff_t(decoded));
  const std::vector<int32_t> window(tokens.begin() + ptrdiff_t(start), tokens.end());
  const std::string before = decode(context);
  const std::string after = decode(window);
  decoded = tokens.size();
  if (after.compare(0, before.size(), before) == 0 && text.size() >= before.size() &&
      text.compare(text.size() - before.size(), before.size(), before) == 0) {
    text.append(after, before.size());
    return true;
  }
  text = decode(tokens);
  return false;
}

}  // namespace baton::router

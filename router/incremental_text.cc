#include "router/incremental_text.h"

namespace baton::router {
namespace {

std::vector<int32_t> joined(const std::vector<int32_t>& lead, const std::vector<int32_t>& tokens,
                            size_t begin, size_t end) {
  std::vector<int32_t> out(lead);
  out.insert(out.end(), tokens.begin() + ptrdiff_t(begin), tokens.begin() + ptrdiff_t(end));
  return out;
}

// The text `ids` add after `lead`: decode(lead + ids) less decode(lead) where
// the one extends the other, else decode(ids).
std::string text_after(const std::vector<int32_t>& lead, const std::vector<int32_t>& ids,
                       const DecodeFn& decode) {
  if (lead.empty()) return decode(ids);
  const std::string lead_text = decode(lead);
  std::vector<int32_t> all(lead);
  all.insert(all.end(), ids.begin(), ids.end());
  const std::string full = decode(all);
  if (full.compare(0, lead_text.size(), lead_text) == 0) return full.substr(lead_text.size());
  return decode(ids);
}

}  // namespace

bool append_decoded(const std::vector<int32_t>& tokens, size_t& decoded, std::string& text,
                    const DecodeFn& decode, const std::vector<int32_t>& lead) {
  if (decoded >= tokens.size()) return true;
  const size_t start = decoded > kDetokenizeContextTokens ? decoded - kDetokenizeContextTokens : 0;
  // The window reaches back to the output's start only in its first updates;
  // then the prompt's last tokens are its context too.
  static const std::vector<int32_t> kNone;
  const std::vector<int32_t>& context_lead = start == 0 ? lead : kNone;
  const std::string before = text_after(context_lead, joined({}, tokens, start, decoded), decode);
  const std::string after =
      text_after(context_lead, joined({}, tokens, start, tokens.size()), decode);
  decoded = tokens.size();
  if (after.compare(0, before.size(), before) == 0 && text.size() >= before.size() &&
      text.compare(text.size() - before.size(), before.size(), before) == 0) {
    text.append(after, before.size());
    return true;
  }
  text = text_after(lead, tokens, decode);
  return false;
}

}  // namespace baton::router

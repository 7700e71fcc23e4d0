#include "engine/jinja/python_text.h"

#include <algorithm>

#include "engine/utf8.h"

namespace baton::jinja::python_text {

bool is_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = engine::utf8::length_at(s, i);
    out.push_back(engine::utf8::decode_at(s, i, n));
    i += n;
  }
  return out;
}

std::string from_code_points(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) engine::utf8::append(cps[i], out);
  return out;
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += engine::utf8::length_at(s, i)) ++n;
  return n;
}

std::string strip(std::string_view s, Side side, const std::optional<std::string>& chars) {
  // Only the ends are decoded: contents are long, what is stripped short.
  std::vector<uint32_t> set;
  if (chars) set = code_points(*chars);
  const auto strippable = [&](uint32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : is_space(cp);
  };
  size_t begin = 0, end = s.size();
  if (side != Side::kRight) {
    while (begin < end) {
      const size_t n = engine::utf8::length_at(s, begin);
      if (!strippable(engine::utf8::decode_at(s, begin, n))) break;
      begin += n;
    }
  }
  if (side != Side::kLeft) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && end - start < 4 &&
             (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) {
        --start;
      }
      size_t n = engine::utf8::length_at(s, start);
      if (start + n != end) {  // a stray byte ends the text
        start = end - 1;
        n = 1;
      }
      if (!strippable(engine::utf8::decode_at(s, start, n))) break;
      end = start;
    }
  }
  return std::string(s.substr(begin, end - begin));
}

namespace {

std::vector<std::string> split_whitespace(std::string_view s, int64_t maxsplit, bool from_right) {
  const std::vector<uint32_t> cps = code_points(s);
  std::vector<std::string> out;
  if (!from_right) {
    size_t i = 0;
    while (true) {
      while (i < cps.size() && is_space(cps[i])) ++i;
      if (i == cps.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        size_t end = cps.size();
        while (end > i && is_space(cps[end - 1])) --end;
        out.push_back(from_code_points(cps, i, end));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !is_space(cps[j])) ++j;
      out.push_back(from_code_points(cps, i, j));
      i = j;
    }
    return out;
  }
  size_t i = cps.size();
  while (true) {
    while (i > 0 && is_space(cps[i - 1])) --i;
    if (i == 0) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      size_t begin = 0;
      while (begin < i && is_space(cps[begin])) ++begin;
      out.push_back(from_code_points(cps, begin, i));
      break;
    }
    size_t j = i;
    while (j > 0 && !is_space(cps[j - 1])) --j;
    out.push_back(from_code_points(cps, j, i));
    i = j;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit) {
  if (!sep) return split_whitespace(s, maxsplit, false);
  std::vector<std::string> out;
  size_t start = 0;
  while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
    const size_t at = s.find(*sep, start);
    if (at == std::string_view::npos) break;
    out.emplace_back(s.substr(start, at - start));
    start = at + sep->size();
  }
  out.emplace_back(s.substr(start));
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit) {
  if (!sep) return split_whitespace(s, maxsplit, true);
  std::vector<std::string> out;
  size_t end = s.size();
  while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
    if (end < sep->size()) break;
    const size_t at = s.rfind(*sep, end - sep->size());
    if (at == std::string_view::npos) break;
    out.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
    end = at;
  }
  out.emplace_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s) {
  std::vector<std::string> out;
  std::string line;
  for (size_t i = 0; i < s.size();) {
    const size_t n = engine::utf8::length_at(s, i);
    const uint32_t cp = engine::utf8::decode_at(s, i, n);
    const bool boundary = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C ||
                          cp == 0x1D || cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (boundary) {
      out.push_back(std::move(line));
      line.clear();
      i += n;
      if (cp == '\r' && i < s.size() && s[i] == '\n') ++i;
      continue;
    }
    line.append(s, i, n);
    i += n;
  }
  if (!line.empty()) out.push_back(std::move(line));
  return out;
}

std::string replace(std::string_view s, std::string_view old_text, std::string_view new_text,
                    int64_t count) {
  std::string out;
  if (old_text.empty()) {
    // Python inserts the new text before every character and at the end.
    int64_t done = 0;
    for (size_t i = 0; i < s.size();) {
      if (count < 0 || done < count) {
        out += new_text;
        ++done;
      }
      const size_t n = engine::utf8::length_at(s, i);
      out.append(s, i, n);
      i += n;
    }
    if (count < 0 || done < count) out += new_text;
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old_text, start);
    if (at == std::string_view::npos) break;
    out.append(s, start, at - start);
    out += new_text;
    start = at + old_text.size();
    ++done;
  }
  out.append(s, start);
  return out;
}

namespace {

// Case mapping of ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic: the
// scripts whose case templates touch (role names, booleans).
uint32_t to_upper(uint32_t cp) {
  if (cp >= 'a' && cp <= 'z') return cp - 32;
  if ((cp >= 0xE0 && cp <= 0xFE && cp != 0xF7)) return cp - 32;
  if (cp == 0xFF) return 0x178;
  if (cp >= 0x100 && cp <= 0x17F && cp != 0x130 && cp != 0x131 && cp != 0x138 && cp != 0x149 &&
      cp != 0x17F) {
    const bool odd_upper = (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E);
    if (odd_upper ? (cp % 2 == 0) : (cp % 2 == 1)) return cp - 1;
    return cp;
  }
  if (cp >= 0x3B1 && cp <= 0x3C9 && cp != 0x3C2) return cp - 32;
  if (cp >= 0x430 && cp <= 0x44F) return cp - 32;
  if (cp >= 0x450 && cp <= 0x45F) return cp - 80;
  return cp;
}

uint32_t to_lower(uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) return cp + 32;
  if (cp == 0x178) return 0xFF;
  if (cp >= 0x100 && cp <= 0x17F && cp != 0x130 && cp != 0x131 && cp != 0x138 && cp != 0x149 &&
      cp != 0x17F) {
    const bool odd_upper = (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E);
    if (odd_upper ? (cp % 2 == 1) : (cp % 2 == 0)) return cp + 1;
    return cp;
  }
  if (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) return cp + 32;
  if (cp >= 0x410 && cp <= 0x42F) return cp + 32;
  if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
  return cp;
}

bool is_cased(uint32_t cp) { return to_upper(cp) != cp || to_lower(cp) != cp; }

template <typename F>
std::string map_code_points(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = engine::utf8::length_at(s, i);
    const uint32_t cp = engine::utf8::decode_at(s, i, n);
    const uint32_t mapped = f(cp);
    if (mapped == cp) {
      out.append(s, i, n);
    } else {
      engine::utf8::append(mapped, out);
    }
    i += n;
  }
  return out;
}

}  // namespace

std::string upper(std::string_view s) {
  return map_code_points(s, [](uint32_t cp) { return to_upper(cp); });
}

std::string lower(std::string_view s) {
  return map_code_points(s, [](uint32_t cp) { return to_lower(cp); });
}

std::string title(std::string_view s) {
  bool previous_cased = false;
  return map_code_points(s, [&](uint32_t cp) {
    const uint32_t mapped = previous_cased ? to_lower(cp) : to_upper(cp);
    previous_cased = is_cased(cp);
    return mapped;
  });
}

std::string capitalize(std::string_view s) {
  bool first = true;
  return map_code_points(s, [&](uint32_t cp) {
    const uint32_t mapped = first ? to_upper(cp) : to_lower(cp);
    first = false;
    return mapped;
  });
}

}  // namespace baton::jinja::python_text

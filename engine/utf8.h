// engine/utf8.h — the few UTF-8 helpers the tokenizers need: encoding a code
// point, the length and value of the character at an offset (a stray byte
// counts as a character of one byte), and Unicode white space.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace baton::engine::utf8 {

inline void append(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

// Bytes of the character starting at s[i]: 1 for ASCII and for a byte that
// does not start a complete, well-formed sequence.
inline size_t length_at(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80           ? 1
                   : (c >> 5) == 0x6  ? 2
                   : (c >> 4) == 0xE  ? 3
                   : (c >> 3) == 0x1E ? 4
                                      : 1;
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  }
  return n;
}

// The code point of the n-byte character at s[i] (the byte itself when n is 1).
inline uint32_t decode_at(std::string_view s, size_t i, size_t n) {
  const auto b = [&](size_t k) { return uint32_t(static_cast<unsigned char>(s[i + k])); };
  switch (n) {
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    case 4:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    default:
      return b(0);
  }
}

// Unicode's White_Space characters (Rust's char::is_whitespace).
inline bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// Bytes of the white-space character starting at `i` (0 if none there).
inline size_t white_space_at(std::string_view s, size_t i) {
  const size_t n = length_at(s, i);
  return is_white_space(decode_at(s, i, n)) ? n : 0;
}

// Bytes of the white-space character ending just before `i` (0 if none).
inline size_t white_space_before(std::string_view s, size_t i) {
  size_t begin = i;
  while (begin > 0 && i - begin < 4) {
    --begin;
    if ((static_cast<unsigned char>(s[begin]) & 0xC0) != 0x80) break;
  }
  if (begin == i) return 0;
  const size_t n = length_at(s, begin);
  return begin + n == i && is_white_space(decode_at(s, begin, n)) ? n : 0;
}

}  // namespace baton::engine::utf8

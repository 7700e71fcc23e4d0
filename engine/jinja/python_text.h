// engine/jinja/python_text.h — Python's str operations on UTF-8 strings, as
// templates call them (str.strip, split, splitlines, upper, ...): white space
// is what str.isspace() accepts, lengths and indices count code points.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace baton::jinja::python_text {

bool is_space(uint32_t cp);
// The code points of s (a stray byte counts as one).
std::vector<uint32_t> code_points(std::string_view s);
std::string from_code_points(const std::vector<uint32_t>& cps, size_t begin, size_t end);
size_t length(std::string_view s);

// str.strip / lstrip / rstrip with no argument (white space) or a set of
// characters.
enum class Side { kLeft, kRight, kBoth };
std::string strip(std::string_view s, Side side, const std::optional<std::string>& chars);

// str.split(sep, maxsplit); no separator splits on runs of white space.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit);
// str.splitlines(keepends=False): every line boundary Python knows.
std::vector<std::string> splitlines(std::string_view s);
std::string replace(std::string_view s, std::string_view old_text, std::string_view new_text,
                    int64_t count);
std::string upper(std::string_view s);
std::string lower(std::string_view s);
// str.title and str.capitalize.
std::string title(std::string_view s);
std::string capitalize(std::string_view s);

}  // namespace baton::jinja::python_text

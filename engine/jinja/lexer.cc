#include "engine/jinja/lexer.h"

#include <algorithm>
#include <array>
#include <cstdlib>

#include "engine/jinja/python_text.h"
#include "engine/utf8.h"

namespace baton::jinja {

std::string describe_position(int line, int column) {
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

namespace {

// Jinja2 reads the source split on \r\n, \r and \n, joined by \n, without
// one trailing newline (keep_trailing_newline is off).
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Bytes of the Python white-space character at s[i] (0 if none).
size_t space_at(std::string_view s, size_t i) {
  const size_t n = engine::utf8::length_at(s, i);
  return python_text::is_space(engine::utf8::decode_at(s, i, n)) ? n : 0;
}

size_t skip_spaces(std::string_view s, size_t i) {
  while (i < s.size()) {
    const size_t n = space_at(s, i);
    if (n == 0) break;
    i += n;
  }
  return i;
}

// text.rstrip(): the length without trailing white space.
size_t rstripped_length(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    size_t begin = end - 1;
    while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80 &&
           end - begin < 4) {
      --begin;
    }
    if (space_at(text, begin) != end - begin) break;
    end = begin;
  }
  return end;
}

bool all_space(std::string_view text) {
  if (text.empty()) return false;
  return skip_spaces(text, 0) == text.size();
}

constexpr std::array<std::string_view, 26> kOperators = {
    "//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
    "]",  "(",  ")",  "{",  "}",  "=",  ".", ":", "|", ",", ";", "<", ">"};

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  Result<std::vector<Token>> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t tag = src_.size();
      for (size_t i = src_.find('{', pos); i != std::string::npos; i = src_.find('{', i + 1)) {
        if (i + 1 < src_.size() &&
            (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
          tag = i;
          break;
        }
      }
      if (tag == src_.size()) {
        emit(Token::Kind::kText, src_.substr(pos), pos);
        break;
      }
      const char kind = src_[tag + 1];
      const char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+')
                            ? src_[tag + 2]
                            : '\0';
      std::string_view text(src_.data() + pos, tag - pos);
      if (sign == '-') {
        text = text.substr(0, rstripped_length(text));
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: white space alone on the tag's line goes.
        const size_t newline = text.rfind('\n');
        const size_t line_begin = newline == std::string_view::npos ? 0 : newline + 1;
        if ((line_begin > 0 || line_starting) && all_space(text.substr(line_begin))) {
          text = text.substr(0, line_begin);
        }
      }
      if (!text.empty()) emit(Token::Kind::kText, std::string(text), pos);
      pos = tag + 2 + (sign != '\0' ? 1 : 0);
      if (kind == '#') {
        BATON_ASSIGN_OR_RETURN(pos, skip_comment(tag, pos));
      } else {
        BATON_ASSIGN_OR_RETURN(pos, lex_tag(kind == '{', tag, pos));
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    tokens_.push_back({Token::Kind::kEnd, "", 0, 0});
    locate(tokens_.back(), src_.size());
    return std::move(tokens_);
  }

 private:
  void locate(Token& token, size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = size_t(it - line_starts_.begin());
    token.line = int(line);
    token.column = int(offset - line_starts_[line - 1]) + 1;
  }

  void emit(Token::Kind kind, std::string text, size_t offset) {
    Token token{kind, std::move(text), 0, 0};
    locate(token, offset);
    tokens_.push_back(std::move(token));
  }

  Status error_at(size_t offset, const std::string& message) const {
    Token where{Token::Kind::kEnd, "", 0, 0};
    locate(where, offset);
    return invalid_argument("template " + describe_position(where.line, where.column) + ": " +
                            message);
  }

  // After `-#}` all white space goes; after `#}` one newline (trim_blocks).
  Result<size_t> skip_comment(size_t tag, size_t pos) {
    const size_t close = src_.find("#}", pos);
    if (close == std::string::npos) return error_at(tag, "missing end of comment tag");
    if (close > pos && src_[close - 1] == '-') return skip_spaces(src_, close + 2);
    if (close > pos && src_[close - 1] == '+') return close + 2;
    size_t end = close + 2;
    if (end < src_.size() && src_[end] == '\n') ++end;
    return end;
  }

  // The tokens of one {{ ... }} or {% ... %} up to and including its end.
  Result<size_t> lex_tag(bool print, size_t tag, size_t pos) {
    emit(print ? Token::Kind::kPrintBegin : Token::Kind::kBlockBegin, print ? "{{" : "{%", tag);
    std::vector<char> balancing;
    const char close_first = print ? '}' : '%';
    while (true) {
      pos = skip_spaces(src_, pos);
      if (pos >= src_.size()) {
        return error_at(tag, print ? "unexpected end of template, expected '}}'"
                                   : "unexpected end of template, expected '%}'");
      }
      if (balancing.empty()) {
        const bool minus = src_.compare(pos, 1, "-") == 0;
        const bool plus = src_.compare(pos, 1, "+") == 0;
        const size_t at = pos + ((minus || plus) ? 1 : 0);
        if (at + 1 < src_.size() && src_[at] == close_first && src_[at + 1] == '}' &&
            !(plus && print)) {
          emit(print ? Token::Kind::kPrintEnd : Token::Kind::kBlockEnd, print ? "}}" : "%}", pos);
          size_t end = at + 2;
          if (minus) return skip_spaces(src_, end);
          if (!print && !plus && end < src_.size() && src_[end] == '\n') ++end;
          return end;
        }
      }
      const char c = src_[pos];
      if (is_name_start(c)) {
        size_t end = pos;
        while (end < src_.size() && is_name_char(src_[end])) ++end;
        emit(Token::Kind::kName, src_.substr(pos, end - pos), pos);
        pos = end;
      } else if (is_digit(c)) {
        BATON_ASSIGN_OR_RETURN(pos, lex_number(pos));
      } else if (c == '\'' || c == '"') {
        BATON_ASSIGN_OR_RETURN(pos, lex_string(pos));
      } else {
        std::string_view op;
        for (std::string_view candidate : kOperators) {
          if (src_.compare(pos, candidate.size(), candidate) == 0) {
            op = candidate;
            break;
          }
        }
        if (op.empty()) return error_at(pos, "unexpected character '" + std::string(1, c) + "'");
        if (op == "(" || op == "[" || op == "{") {
          balancing.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (balancing.empty()) return error_at(pos, "unexpected '" + std::string(op) + "'");
          if (balancing.back() != op[0]) {
            return error_at(pos, "unexpected '" + std::string(op) + "', expected '" +
                                     std::string(1, balancing.back()) + "'");
          }
          balancing.pop_back();
        }
        emit(Token::Kind::kOperator, std::string(op), pos);
        pos += op.size();
      }
    }
  }

  Result<size_t> lex_number(size_t pos) {
    const bool after_dot = !tokens_.empty() && tokens_.back().kind == Token::Kind::kOperator &&
                           tokens_.back().text == ".";
    size_t end = pos;
    const auto digits = [&](size_t i) {
      while (i < src_.size() && (is_digit(src_[i]) || (src_[i] == '_' && i + 1 < src_.size() &&
                                                       is_digit(src_[i + 1])))) {
        ++i;
      }
      return i;
    };
    if (src_[pos] == '0' && pos + 1 < src_.size() &&
        (src_[pos + 1] == 'x' || src_[pos + 1] == 'X' || src_[pos + 1] == 'o' ||
         src_[pos + 1] == 'O' || src_[pos + 1] == 'b' || src_[pos + 1] == 'B')) {
      const int base = (src_[pos + 1] | 0x20) == 'x' ? 16 : (src_[pos + 1] | 0x20) == 'o' ? 8 : 2;
      end = pos + 2;
      std::string clean;
      while (end < src_.size() &&
             (std::isxdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) {
        if (src_[end] != '_') clean += src_[end];
        ++end;
      }
      char* parsed_end = nullptr;
      const long long value = std::strtoll(clean.c_str(), &parsed_end, base);
      if (clean.empty() || *parsed_end != '\0') return error_at(pos, "malformed number");
      emit(Token::Kind::kInteger, std::to_string(value), pos);
      return end;
    }
    end = digits(pos);
    bool is_float = false;
    if (!after_dot) {
      if (end + 1 < src_.size() && src_[end] == '.' && is_digit(src_[end + 1])) {
        end = digits(end + 1);
        is_float = true;
      }
      if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
        size_t e = end + 1;
        if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
        if (e < src_.size() && is_digit(src_[e])) {
          end = digits(e);
          is_float = true;
        }
      }
    }
    std::string text;
    for (size_t i = pos; i < end; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    emit(is_float ? Token::Kind::kFloat : Token::Kind::kInteger, text, pos);
    return end;
  }

  // A quoted literal with Python's escapes.
  Result<size_t> lex_string(size_t pos) {
    const char quote = src_[pos];
    std::string value;
    size_t i = pos + 1;
    const auto hex = [&](size_t at, int count) -> std::optional<uint32_t> {
      if (at + size_t(count) > src_.size()) return std::nullopt;
      uint32_t cp = 0;
      for (int k = 0; k < count; ++k) {
        const char h = src_[at + size_t(k)];
        if (!std::isxdigit(static_cast<unsigned char>(h))) return std::nullopt;
        cp = cp * 16 + uint32_t(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      return cp;
    };
    while (true) {
      if (i >= src_.size()) return error_at(pos, "unterminated string");
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) return error_at(pos, "unterminated string");
      const char e = src_[i + 1];
      i += 2;
      switch (e) {
        case '\n':
          break;
        case '\\':
        case '\'':
        case '"':
          value += e;
          break;
        case 'a':
          value += '\a';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'n':
          value += '\n';
          break;
        case 'r':
          value += '\r';
          break;
        case 't':
          value += '\t';
          break;
        case 'v':
          value += '\v';
          break;
        case 'x':
        case 'u':
        case 'U': {
          const int count = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          const auto cp = hex(i, count);
          if (!cp || *cp > 0x10FFFF)
            return error_at(i - 2, "malformed \\" + std::string(1, e) + " escape");
          engine::utf8::append(*cp, value);
          i += size_t(count);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = uint32_t(e - '0');
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) {
              cp = cp * 8 + uint32_t(src_[i++] - '0');
            }
            engine::utf8::append(cp, value);
          } else {
            value += '\\';
            value += e;
          }
      }
    }
    emit(Token::Kind::kString, std::move(value), pos);
    return i + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

Result<std::vector<Token>> tokenize(std::string_view source) {
  return Lexer(normalize_newlines(source)).run();
}

}  // namespace baton::jinja

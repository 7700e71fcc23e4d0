#include "router/api_keys.h"

#include <cstdlib>
#include <fstream>

#include "common/regular_file.h"

namespace baton::router {

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  volatile unsigned char difference = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference = difference | (static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]));
  }
  return difference == 0;
}

ApiKeys::ApiKeys(std::vector<std::string> keys) : keys_(std::move(keys)) {}

Result<ApiKeys> ApiKeys::load(const std::filesystem::path& key_file) {
  std::vector<std::string> keys;
  if (const char* env = std::getenv(kApiKeyEnvironment); env != nullptr && *env != '\0') {
    keys.emplace_back(env);
  }
  if (!key_file.empty()) {
    if (Status file = check_regular_file(key_file); !file.is_ok()) {
      return Status(file.code(), "router.api_key_file: " + file.message());
    }
    std::ifstream in(key_file);
    if (!in) return not_found("router.api_key_file: cannot open " + key_file.string());
    size_t found = 0;
    std::string line;
    while (std::getline(in, line)) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) {
        line.pop_back();
      }
      const size_t start = line.find_first_not_of(" \t");
      if (start == std::string::npos || line[start] == '#') continue;
      keys.push_back(line.substr(start));
      ++found;
    }
    if (in.bad()) return io_error("router.api_key_file: cannot read " + key_file.string());
    if (found == 0)
      return invalid_argument("router.api_key_file: " + key_file.string() + " holds no key");
  }
  return ApiKeys(std::move(keys));
}

bool ApiKeys::admits(std::string_view path, std::string_view authorization) const {
  if (keys_.empty() || !path.starts_with("/v1/")) return true;
  constexpr std::string_view kBearer = "Bearer ";
  if (!authorization.starts_with(kBearer)) return false;
  const std::string_view offered = authorization.substr(kBearer.size());
  bool match = false;
  for (const std::string& key : keys_) match = constant_time_equal(offered, key) || match;
  return match;
}

const std::string& ApiKeys::first() const {
  static const std::string none;
  return keys_.empty() ? none : keys_.front();
}

}  // namespace baton::router

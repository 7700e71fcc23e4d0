// router/api_keys.h — API keys on the OpenAI routes, in vLLM's manner.
//
// With keys configured, every request to a /v1/ route (the OpenAI routes and
// /v1/nodes) must carry `Authorization: Bearer KEY` with one of them, or it
// gets 401 {"error": "Unauthorized"}, as vLLM answers. /health, /metrics,
// /tokenize and /detokenize stay open, as in vLLM. Keys come from the
// BATON_API_KEY environment variable and from the file the cluster YAML's
// router.api_key_file names (one key per line; blank lines and lines
// starting with '#' are skipped). Without keys everything is open.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace baton::router {

inline constexpr const char* kApiKeyEnvironment = "BATON_API_KEY";

class ApiKeys {
 public:
  ApiKeys() = default;
  explicit ApiKeys(std::vector<std::string> keys);
  // BATON_API_KEY and `key_file` (empty: none). A key file that cannot be
  // read or holds no key is an error naming it.
  static Result<ApiKeys> load(const std::filesystem::path& key_file);

  bool required() const { return !keys_.empty(); }
  // Whether a request to `path` with this Authorization header may proceed.
  bool admits(std::string_view path, std::string_view authorization) const;
  // The first key, for Baton's own clients (`baton up`'s readiness checks).
  const std::string& first() const;

 private:
  std::vector<std::string> keys_;
};

// a == b in time that depends on their lengths only, not on where they differ.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace baton::router

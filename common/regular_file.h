// common/regular_file.h — what every configuration file Baton reads must be
// before it is read: a regular file (not a directory, a FIFO that never
// ends, or /dev/zero) of a bounded size, so that a wrong path is an error
// naming it, never a hang, an exhausted memory or an uncaught exception.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>

#include "common/status.h"

namespace baton {

// Larger than any tokenizer.json or cluster YAML Baton expects.
inline constexpr uintmax_t kMaxConfigFileBytes = uintmax_t(256) << 20;

inline Status check_regular_file(const std::filesystem::path& path,
                                 uintmax_t max_bytes = kMaxConfigFileBytes) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);  // through symlinks
  if (ec || !std::filesystem::exists(status)) return not_found(path.string() + ": no such file");
  if (std::filesystem::is_directory(status)) {
    return invalid_argument(path.string() + ": is a directory, not a file");
  }
  if (!std::filesystem::is_regular_file(status)) {
    return invalid_argument(path.string() + ": not a regular file");
  }
  const uintmax_t bytes = std::filesystem::file_size(path, ec);
  if (ec) return io_error("cannot read " + path.string() + ": " + ec.message());
  if (bytes > max_bytes) {
    return invalid_argument(path.string() + ": " + std::to_string(bytes) + " bytes, over the " +
                            std::to_string(max_bytes >> 20) + " MiB a configuration file may have");
  }
  return Status::ok();
}

}  // namespace baton

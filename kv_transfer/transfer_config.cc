#include "kv_transfer/transfer_config.h"

namespace baton::kv_transfer {

std::string_view transfer_mode_name(TransferMode mode) {
  switch (mode) {
    case TransferMode::kAuto:
      return "auto";
    case TransferMode::kRma:
      return "rma";
    case TransferMode::kTag:
      return "tag";
    case TransferMode::kAm:
      return "am";
  }
  return "?";
}

std::optional<TransferMode> parse_transfer_mode(std::string_view name) {
  if (name == "auto") return TransferMode::kAuto;
  if (name == "rma") return TransferMode::kRma;
  if (name == "tag") return TransferMode::kTag;
  if (name == "am") return TransferMode::kAm;
  return std::nullopt;
}

Status check_duration(std::chrono::milliseconds d, const std::string& what) {
  if (d.count() <= 0) return invalid_argument(what + " must be positive");
  if (d > kMaxDeadline) {
    return out_of_range(what + " of " + std::to_string(d.count()) + " ms is over " +
                        std::to_string(kMaxDeadline.count()) + " ms");
  }
  return Status::ok();
}

Status check_staging_blocks(int32_t staging_blocks, int64_t longest_tokens, int32_t block_size,
                            const std::string& key) {
  const int64_t needed = (longest_tokens + block_size - 1) / block_size;
  if (staging_blocks <= 0 || staging_blocks >= needed) return Status::ok();
  return invalid_argument(key + ": " + std::to_string(staging_blocks) +
                          " host slots cannot carry the longest prompt's KV, " +
                          std::to_string(longest_tokens) + " tokens, which needs " +
                          std::to_string(needed) + " blocks");
}

Status validate(const TransferConfig& config) {
  BATON_RETURN_IF_ERROR(check_duration(config.default_deadline, "kv_transfer.default_deadline_ms"));
  BATON_RETURN_IF_ERROR(check_duration(config.close_timeout, "kv_transfer.close_timeout_ms"));
  if (config.close_timeout < kMinCloseTimeout) {
    return out_of_range("kv_transfer.close_timeout_ms of " +
                        std::to_string(config.close_timeout.count()) + " ms is under " +
                        std::to_string(kMinCloseTimeout.count()) +
                        " ms: put grants would expire before their puts land");
  }
  BATON_RETURN_IF_ERROR(check_duration(config.idle_wait, "kv_transfer.idle_wait_ms"));
  if (config.staging_blocks < 0) {
    return out_of_range("kv_transfer.staging_blocks: " + std::to_string(config.staging_blocks) +
                        " is negative");
  }
  for (const auto& [key, value] : config.ucx_env) {
    if (key.rfind("UCX_", 0) != 0 || key.size() == 4) {
      return invalid_argument("kv_transfer.ucx_env key '" + key + "' does not start with UCX_");
    }
  }
  return Status::ok();
}

}  // namespace baton::kv_transfer

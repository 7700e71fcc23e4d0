#include "router/prefill_placement.h"

namespace baton::router {

std::string_view placement_name(PrefillPlacement placement) {
  switch (placement) {
    case PrefillPlacement::kPrefillNode:
      return "prefill_node";
    case PrefillPlacement::kShortPrompt:
      return "short_prompt";
    case PrefillPlacement::kNoPrefillNode:
      return "no_prefill_node";
    case PrefillPlacement::kPrefillQueuesFull:
      return "prefill_queues_full";
    case PrefillPlacement::kCachedPrompt:
      return "cached_prompt";
  }
  return "unknown";
}

PrefillPlacement place_prefill(const PrefillPlacementRule& rule, int64_t prompt_tokens,
                               std::optional<int64_t> least_prefill_queue, int64_t decode_queue) {
  if (prompt_tokens < rule.min_remote_prefill_tokens) return PrefillPlacement::kShortPrompt;
  if (!least_prefill_queue) return PrefillPlacement::kNoPrefillNode;
  const int64_t limit = rule.max_prefill_queue_tokens;
  if (limit <= 0 || *least_prefill_queue < limit || decode_queue >= limit)
    return PrefillPlacement::kPrefillNode;
  return PrefillPlacement::kPrefillQueuesFull;
}

}  // namespace baton::router

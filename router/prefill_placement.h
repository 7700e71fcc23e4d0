// router/prefill_placement.h — where a prompt is prefilled: on a prefill
// node, which sends its KV to the decode node, or on the decode node that
// generates it.
//
// Short prompts stay on the decode node: a transfer's fixed costs outweigh
// their compute. Past a queue limit they stay there too (conditional
// disaggregation, as Dynamo's disaggregated router does): when every prefill
// node already has `max_prefill_queue_tokens` prompt tokens waiting, a decode
// node with fewer of its own waiting computes the prompt in chunks beside its
// running decodes, instead of idling between small decode steps while the
// prompt waits. When both sides are that full the prompt goes to a prefill
// node, whose job it is.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace baton::router {

struct PrefillPlacementRule {
  int32_t min_remote_prefill_tokens = 32;
  int64_t max_prefill_queue_tokens = 0;  // 0: prefill nodes take every long prompt
};

enum class PrefillPlacement {
  kPrefillNode,
  kShortPrompt,        // on the decode node: below min_remote_prefill_tokens
  kNoPrefillNode,      // on the decode node: no prefill node is up
  kPrefillQueuesFull,  // on the decode node: every prefill node is at the queue limit
  kCachedPrompt,       // on the decode node: another sample of the prompt left its KV there
};
inline constexpr PrefillPlacement kAllPrefillPlacements[] = {
    PrefillPlacement::kPrefillNode, PrefillPlacement::kShortPrompt,
    PrefillPlacement::kNoPrefillNode, PrefillPlacement::kPrefillQueuesFull,
    PrefillPlacement::kCachedPrompt};

// The label /metrics gives a placement.
std::string_view placement_name(PrefillPlacement placement);

// `least_prefill_queue`: the fewest prompt tokens waiting (placed, not yet
// prefilled) on a prefill node that is up; nullopt when none is up.
// `decode_queue`: the prompt tokens waiting to be prefilled on the decode
// node chosen for the request.
PrefillPlacement place_prefill(const PrefillPlacementRule& rule, int64_t prompt_tokens,
                               std::optional<int64_t> least_prefill_queue, int64_t decode_queue);

}  // namespace baton::router

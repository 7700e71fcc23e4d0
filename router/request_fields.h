// router/request_fields.h — which request fields Baton honours.
//
// A field Baton does not implement must never be silently ignored: a client
// that asked for a penalty, a bias or a grammar would get other text than it
// asked for, with no word. Every top-level field of a completion or chat body
// is one of:
//   - implemented (read by completion_request.cc);
//   - accepted at its neutral value only, the value that asks for nothing
//     (presence_penalty 0, min_p 0, echo false, response_format text, ...);
//     any other value is a 400 naming the field;
//   - informational, changing nothing generated (user, metadata, store,
//     service_tier, request_id);
//   - anything else: a 400 naming the field.
// A null value is the field's default, as in OpenAI's API.
#pragma once

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace baton::router {

enum class Endpoint { kCompletions, kChatCompletions };

Status check_request_fields(const nlohmann::json& body, Endpoint endpoint);

}  // namespace baton::router

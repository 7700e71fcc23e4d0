// tools/loadtest/sharegpt.h — reads prompts in ShareGPT's layout: one JSON
// object per line (JSONL; a file holding one JSON array of such objects, as
// the original ShareGPT dump is, is read too), each with
//
//   {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}, ...]}
//
// The first turn is the prompt and the second the reply whose length sets
// the output length, as `vllm bench serve --dataset-name sharegpt` uses them.
// Conversations with fewer than two turns or an empty prompt are skipped;
// anything malformed is
// an error naming the file, the line and the field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace baton::loadtest {

struct Conversation {
  std::string prompt;
  std::string reply;
};

struct ShareGptData {
  std::vector<Conversation> conversations;
  int64_t skipped = 0;  // conversations with fewer than two turns or an empty prompt
};

// `name` prefixes error messages ("data.jsonl:3: ...").
Result<ShareGptData> parse_sharegpt(std::string_view text, const std::string& name);
Result<ShareGptData> read_sharegpt(const std::string& path);

}  // namespace baton::loadtest

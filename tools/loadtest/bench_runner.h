// tools/loadtest/bench_runner.h — sends a planned list of requests at their
// scheduled times from a pool of client threads and records each one.
//
// Worker w takes the next request in schedule order, waits for its send time
// and sends it; with `max_concurrency` workers, a request whose time has come
// while all are busy waits for the first to free up (as `vllm bench serve
// --max-concurrency` holds it at a semaphore), and TTFT counts from when it
// is actually sent. Without a limit there is one worker per request, at most
// kMaxInFlight.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tools/loadtest/bench_client.h"
#include "tools/loadtest/serving_stats.h"

namespace baton::loadtest {

inline constexpr int64_t kMaxInFlight = 1024;

struct PlannedRequest {
  std::string body;        // the JSON body
  int64_t prompt_len = 0;  // the client's count, if the reply has no usage
  double send_at_s = 0;    // from the start of the run
};

struct RunOptions {
  std::string path = "/v1/completions";
  int64_t max_concurrency = 0;  // 0: no limit
  bool progress = false;        // a progress bar on stderr
};

struct RunOutcome {
  std::vector<RequestRecord> records;  // in plan order, start_s filled in
  double duration_s = 0;               // first send to last reply
  double started_at_unix = 0;          // wall clock at the start, seconds since 1970
};

using ClientFactory = std::function<Result<std::unique_ptr<BenchClient>>()>;

RunOutcome run_requests(const std::vector<PlannedRequest>& plan, const ClientFactory& connect,
                        const RunOptions& options);

}  // namespace baton::loadtest

// tools/loadtest/bench_session.h — one `baton bench` invocation from its
// options to results: asks the router for the model name, builds the seeded
// request list (this shard's part of it), sends a warm-up request, then runs
// the list at one or more request rates.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/status.h"
#include "tools/loadtest/bench_client.h"
#include "tools/loadtest/bench_runner.h"
#include "tools/loadtest/report.h"
#include "tools/loadtest/workload.h"

namespace baton::loadtest {

struct BenchOptions {
  ServerAddress address;
  std::string endpoint = "/v1/completions";
  std::string model;               // empty: the router's, from /v1/models
  std::string dataset = "random";  // random, prefix or sharegpt
  std::string dataset_path;        // sharegpt: the JSONL file
  int64_t num_prompts = 1000;      // of the whole run, all shards together
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  int64_t max_concurrency = 0;  // 0: none
  uint64_t seed = 0;
  RandomWorkload random;
  PrefixWorkload prefix;
  int64_t sharegpt_output_len = 0;  // 0: the reply's length
  int32_t vocab_size = kDefaultVocabSize;
  SamplingOptions sampling;
  Slo slo;
  std::vector<double> metric_percentiles{99.0};  // besides the median
  std::string shard;                             // "i/N", empty: the whole list
  bool progress = false;                         // a progress bar on stderr
};

class BenchSession {
 public:
  static Result<BenchSession> prepare(const BenchOptions& options);

  // Sends this shard's first request once; an error says why the run cannot start.
  Status warm_up() const;
  // Runs the whole list at `request_rate` (the arrival schedule of the whole
  // run, seeded, of which this shard sends its part).
  Result<BenchResult> run(double request_rate) const;

  const BenchConfig& config() const { return config_; }
  size_t num_requests() const { return bodies_.size(); }

 private:
  BenchSession() = default;
  ClientFactory client_factory() const;

  BenchOptions options_;
  BenchConfig config_;
  Shard shard_;
  std::vector<std::string> bodies_;   // this shard's requests, in schedule order
  std::vector<int64_t> prompt_lens_;  // the client's counts
  std::vector<size_t> indices_;       // their places in the whole list
};

}  // namespace baton::loadtest

#include "tools/loadtest/bench_session.h"

#include "tools/loadtest/arrivals.h"
#include "tools/loadtest/sharegpt.h"

namespace baton::loadtest {
namespace {

Result<std::vector<BenchRequest>> make_requests(const BenchOptions& o, Endpoint endpoint) {
  WorkloadOptions workload;
  workload.vocab_size = o.vocab_size;
  workload.text_prompts = endpoint == Endpoint::kChatCompletions;
  workload.seed = o.seed;
  if (o.dataset == "random") return random_requests(o.num_prompts, o.random, workload);
  if (o.dataset == "prefix") return prefix_requests(o.num_prompts, o.prefix, workload);
  if (o.dataset == "sharegpt") {
    if (o.dataset_path.empty())
      return invalid_argument("--dataset-name sharegpt needs --dataset-path");
    BATON_ASSIGN_OR_RETURN(ShareGptData data, read_sharegpt(o.dataset_path));
    return sharegpt_requests(o.num_prompts, data.conversations, o.sharegpt_output_len, o.seed);
  }
  return invalid_argument("--dataset-name must be random, prefix or sharegpt, got '" + o.dataset +
                          "'");
}

}  // namespace

Result<BenchSession> BenchSession::prepare(const BenchOptions& options) {
  if (options.num_prompts < 1) return invalid_argument("--num-prompts must be at least 1");
  if (options.max_concurrency < 0) return invalid_argument("--max-concurrency must be at least 0");
  BenchSession session;
  session.options_ = options;
  BATON_ASSIGN_OR_RETURN(Endpoint endpoint, parse_endpoint(options.endpoint));
  if (!options.shard.empty()) {
    BATON_ASSIGN_OR_RETURN(session.shard_, parse_shard(options.shard));
  }
  BATON_ASSIGN_OR_RETURN(std::vector<BenchRequest> requests, make_requests(options, endpoint));
  // Check the arrival options before anything is sent.
  BATON_RETURN_IF_ERROR(
      arrival_times(0, {options.request_rate, options.burstiness, options.seed}).status());

  std::string model = options.model;
  // Asked over ZeroMQ even when given: a request to no one there would
  // wait out its whole timeout before the bench could say so.
  if (model.empty() || options.address.backend == Backend::kZmq) {
    BATON_ASSIGN_OR_RETURN(std::unique_ptr<BenchClient> client, connect_client(options.address));
    Result<std::string> served = served_model(*client);
    if (!served.is_ok()) {
      return served.status().with_context(model.empty()
                                              ? "asking the router for its model (or give --model)"
                                              : "asking the router for its models");
    }
    if (model.empty()) model = *served;
  }
  session.indices_ = shard_indices(requests.size(), session.shard_);
  if (session.indices_.empty())
    return invalid_argument("--shard " + options.shard + " gets no request of " +
                            std::to_string(requests.size()));
  for (size_t i : session.indices_) {
    session.bodies_.push_back(request_body(requests[i], endpoint, model, options.sampling).dump());
    session.prompt_lens_.push_back(requests[i].prompt_len);
  }

  BenchConfig& config = session.config_;
  config.backend = backend_name(options.address.backend);
  config.endpoint = options.endpoint;
  config.model = model;
  config.dataset = options.dataset;
  config.num_prompts = options.num_prompts;
  config.request_rate = options.request_rate;
  config.burstiness = options.burstiness;
  config.max_concurrency = options.max_concurrency;
  config.seed = options.seed;
  config.shard = options.shard;
  config.slo = options.slo;
  config.metric_percentiles = options.metric_percentiles;
  return session;
}

ClientFactory BenchSession::client_factory() const {
  return [address = options_.address] { return connect_client(address); };
}

Status BenchSession::warm_up() const {
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<BenchClient> client, client_factory()());
  RequestRecord record = client->stream(options_.endpoint, bodies_.front(), prompt_lens_.front());
  if (!record.success) {
    return unavailable(
        "the warm-up request failed, so the benchmark did not start: " + record.error +
        " (check the address, --endpoint, --model and the prompt and output "
        "lengths against the model's max_model_len)");
  }
  return Status::ok();
}

Result<BenchResult> BenchSession::run(double request_rate) const {
  BATON_ASSIGN_OR_RETURN(
      std::vector<double> times,
      arrival_times(int64_t(options_.num_prompts), {.request_rate = request_rate,
                                                    .burstiness = options_.burstiness,
                                                    .seed = options_.seed}));
  std::vector<PlannedRequest> plan;
  for (size_t k = 0; k < indices_.size(); ++k)
    plan.push_back({bodies_[k], prompt_lens_[k], times[indices_[k]]});
  RunOptions run;
  run.path = options_.endpoint;
  run.max_concurrency = options_.max_concurrency;
  run.progress = options_.progress;
  RunOutcome outcome = run_requests(plan, client_factory(), run);
  BenchResult result;
  result.config = config_;
  result.config.request_rate = request_rate;
  result.started_at_unix = outcome.started_at_unix;
  result.duration_s = outcome.duration_s;
  result.records = std::move(outcome.records);
  return result;
}

}  // namespace baton::loadtest

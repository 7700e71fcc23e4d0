// tests/integration/cluster_harness.h — a real Baton cluster for tests:
// a tiny random model, a cluster YAML on free loopback ports, and `baton up`
// running it as real processes (router, prefill and decode nodes talking
// ZeroMQ, UCX and HTTP). Tests talk to it over HTTP like any client.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/http_client.h"
#include "tools/process_group.h"

namespace baton::testing {

struct ClusterShape {
  int prefill_nodes = 1;
  int decode_nodes = 1;
  std::string policy = "round-robin";
  int min_remote_prefill_tokens = 8;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 256;
  int max_model_len = 1024;
  int heartbeat_interval_ms = 100;
  int heartbeat_timeout_ms = 600;
  std::string extra_router_yaml;  // appended under router:
  bool separate_roles = false;    // `baton router|prefill|decode` processes instead of `baton up`
  // With separate_roles: false starts the router alone, and the test plays
  // the nodes (set wait_until_up to false).
  bool start_nodes = true;
  bool share_pool = true;          // transfer.share_pool (false: private pools, CMA transfers)
  int staging_blocks = 0;          // transfer.staging_blocks; 0: not set
  int prefill_staging_blocks = 0;  // the prefill nodes' own transfer.staging_blocks; 0: not set
  std::string kv_cache_bytes = "4MiB";
  std::string kv_dtype;         // engine.kv_dtype; empty: auto
  std::filesystem::path model;  // the checkpoint served; empty: tiny_model()
  std::string ssd_cache_dir;    // engine.ssd_cache_dir, relative to the YAML (made); empty: none
  int prefill_nice = 0;         // the prefill nodes' engine.nice
  int decode_min_step_interval_ms = 0;  // the decode nodes' engine.min_step_interval_ms
  // `baton up --max-restarts`: 0 (the harness's default) leaves a killed
  // role down, for the tests that restart it by hand.
  int max_restarts = 0;
  bool wait_until_up = true;  // false: the constructor returns once `baton up` is started
  // Non-empty: the router requires this API key (a key file named in the
  // YAML), and get/post/post_stream send it.
  std::string api_key;
  // The control plane over CURVE: `baton keygen` writes keys into the
  // cluster's directory (keys/), and the YAML names them.
  bool control_keys = false;
  // The ZeroMQ client front end over CURVE: `baton keygen --clients` writes
  // keys into zmq-keys/, and the YAML names them as router.zmq_keys.
  bool zmq_keys = false;
};

class Cluster {
 public:
  // Makes the model (once per test binary), writes the YAML, runs `baton up`
  // and waits until every node is registered (unless shape.wait_until_up is
  // false). Fails the test on error.
  explicit Cluster(const ClusterShape& shape);
  ~Cluster();  // SIGTERM to `baton up`, which drains and stops everything

  // Starts `baton ROLE --config FILE --name NAME` as a process of the test
  // (a node restarted by hand after a crash).
  void start_node(const std::string& role, const std::string& name);
  // `baton router --config FILE` as a process of the test (named "router").
  void start_router();
  // Whether `baton up` still runs (it has not stopped the cluster).
  bool up_running();
  // The pid of `baton up`; 0 once it has exited.
  pid_t up_pid() const { return group_.pid("up"); }
  // Kills a process the test started ("router", a node name) and reaps it.
  void kill_process(const std::string& name);
  // Whether the router lists `name` as up.
  bool node_up(const std::string& name) const;

  // Sends SIGTERM to `baton up` now and waits up to `grace` for it to exit;
  // returns its waitpid status, or -1 if it had to be killed.
  int terminate(std::chrono::milliseconds grace);

  const std::filesystem::path& model_dir() const { return model_dir_; }
  const std::filesystem::path& config_file() const { return config_file_; }
  uint16_t http_port() const { return http_port_; }
  uint16_t control_port() const { return control_port_; }
  const std::filesystem::path& dir() const { return dir_; }
  uint16_t zmq_port() const { return zmq_port_; }

  Result<tools::HttpResponse> get(const std::string& target) const;
  Result<tools::HttpResponse> post(const std::string& target, const nlohmann::json& body) const;
  // A body sent as it is, JSON or not.
  Result<tools::HttpResponse> post_raw(const std::string& target, const std::string& body) const;
  // POST with stream: true; returns every SSE `data:` payload in order.
  Result<std::vector<std::string>> post_stream(const std::string& target,
                                               const nlohmann::json& body) const;

  // /v1/nodes, parsed.
  nlohmann::json nodes() const;
  pid_t node_pid(const std::string& name) const;
  // Waits until every node that is up reports free == total KV blocks (and
  // staging slots) and nothing running or queued; false on timeout.
  bool wait_drained(std::chrono::milliseconds timeout) const;
  // Tokens the nodes of `role` have generated since they started, as their
  // heartbeats report them, read after a few heartbeat intervals so the
  // reports are fresh.
  int64_t generated_tokens(const std::string& role) const;
  // The sum of the router's /metrics samples of `name` whose labels contain
  // `label` (e.g. finished_reason="abort"); -1 when /metrics cannot be read
  // or has no such sample (a check that a count stayed put must not pass
  // because the metric was renamed).
  double metric(const std::string& name, const std::string& label = "") const;

 private:
  std::filesystem::path dir_;
  std::filesystem::path model_dir_;
  std::filesystem::path config_file_;
  uint16_t http_port_ = 0;
  std::string api_key_;
  uint16_t control_port_ = 0;
  uint16_t zmq_port_ = 0;
  std::chrono::milliseconds heartbeat_interval_{100};
  tools::ProcessGroup group_;
};

// The SSE payloads of a streamed body ("data: X\n\n" -> X).
std::vector<std::string> sse_payloads(const std::string& body);
// A loopback port free now and never handed to another test process (nor
// by the OS to anyone) while this one runs.
uint16_t free_port();
// The tiny test model (made on first use in a temporary directory).
const std::filesystem::path& tiny_model();
// The tiny model's weights as a Mistral checkpoint whose every layer has a
// sliding window of `window` tokens (made on first use).
const std::filesystem::path& windowed_tiny_model(int32_t window);
// A `baton` command line run to its end.
struct BatonRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};
BatonRun run_baton(const std::vector<std::string>& args);
// `baton generate --json` for one prompt; the parsed line.
nlohmann::json baton_generate(const std::string& prompt, const std::vector<std::string>& flags,
                              const std::filesystem::path& model = tiny_model());

// Greedy outputs of two runs are equal where their logits agree bit for
// bit; a cluster batches a sequence otherwise than `baton generate` does
// (the projections' GEMV of one row against several), so where the two
// likeliest tokens tie within rounding the runs may take one each and part
// there. A completion asked `with_tie_evidence` (two alternatives a token,
// named by id) can tell such a tie.
nlohmann::json with_tie_evidence(nlohmann::json body);
// The tokens `choice` (asked with_tie_evidence) and `expected` (generate's
// output_ids) have in common from the start.
size_t same_tokens(const nlohmann::json& choice, const nlohmann::json& expected);
// `choice` (asked with_tie_evidence) and `expected` (generate with
// --logprobs 2): the same text, or a parting at a token where the cluster's
// two likeliest are within 1e-4 and generate took the other of them (a
// test failure otherwise). True where they parted (what follows then
// differs too).
bool expect_greedy_equal_or_tied(const nlohmann::json& choice, const nlohmann::json& expected,
                                 const std::string& what);

}  // namespace baton::testing

#include "cluster/cluster_config.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>

#include "engine/make_model.h"

namespace baton::cluster {
namespace {

namespace fs = std::filesystem;

const std::string kModel = "model: {path: m}\n";
const std::string kNodes = "prefill: [{name: p}]\ndecode: [{name: d}]\n";

Result<ClusterConfig> parse(const std::string& yaml, const fs::path& base = "/cfg") {
  return parse_cluster_config(YAML::Load(yaml), base);
}

engine::ModelConfig preset(const char* name, DType dtype) {
  auto model = engine::model_preset(name);
  EXPECT_TRUE(model.is_ok()) << model.status().to_string();
  model->torch_dtype = dtype;  // as make-model writes it
  return *model;
}

// Expects `config` to fail with one InvalidArgument line containing `expected`.
void expect_error(const Result<ClusterConfig>& config, const std::string& expected,
                  const std::string& yaml) {
  ASSERT_FALSE(config.is_ok()) << yaml;
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << yaml;
  const std::string& message = config.status().message();
  EXPECT_NE(message.find(expected), std::string::npos)
      << yaml << "\n  -> " << message << "\n  wanted: " << expected;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(ClusterConfig, MissingMeansDefault) {
  auto config = parse(kModel + kNodes);
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  const RouterSection defaults;
  const RouterSection& r = config->router;
  EXPECT_EQ(r.host, "127.0.0.1");
  EXPECT_EQ(r.http_port, 8000);
  EXPECT_EQ(r.zmq_port, 8001);
  EXPECT_EQ(r.control_port, 8002);
  EXPECT_EQ(r.policy, RoutingPolicy::kLeastLoaded);
  EXPECT_EQ(r.max_queued_requests, 1024);
  EXPECT_EQ(r.request_timeout, std::chrono::milliseconds(600000));
  EXPECT_EQ(r.heartbeat_interval, std::chrono::milliseconds(200));
  EXPECT_EQ(r.heartbeat_timeout, std::chrono::milliseconds(2000));
  EXPECT_EQ(r.node_stall_timeout, std::chrono::milliseconds(300000));
  EXPECT_EQ(r.min_remote_prefill_tokens, 32);
  EXPECT_EQ(r.max_prefill_queue_tokens, 0);
  EXPECT_EQ(r.drain_timeout, std::chrono::milliseconds(10000));
  EXPECT_EQ(r.http_threads, 1);
  EXPECT_EQ(r.limits.max_n, 16);
  EXPECT_EQ(r.limits.max_batch, 256);
  EXPECT_EQ(r.limits.max_logprobs, 20);
  EXPECT_EQ(r.limits.max_stop_strings, 16);

  EXPECT_EQ(config->model.path, fs::path("/cfg/m"));
  EXPECT_EQ(config->model.served_name, "m");
  EXPECT_EQ(config->model.dtype, DType::kBF16);
  EXPECT_EQ(config->model.seed, 0u);
  EXPECT_TRUE(config->model.preset.empty());

  ASSERT_EQ(config->prefill.size(), 1u);
  ASSERT_EQ(config->decode.size(), 1u);
  const NodeSection& p = config->prefill[0];
  EXPECT_EQ(p.name, "p");
  EXPECT_EQ(p.role, Role::kPrefill);
  EXPECT_EQ(p.host, "127.0.0.1");
  EXPECT_EQ(p.engine.block_size, 16);
  EXPECT_EQ(p.engine.kv_cache_bytes, 256ull << 20);
  EXPECT_EQ(p.engine.threads, 0);
  EXPECT_EQ(p.transfer.mode, kv_transfer::TransferMode::kAuto);
  EXPECT_EQ(p.transfer.default_deadline, std::chrono::milliseconds(3000));
  EXPECT_TRUE(p.transfer.verify_checksum);
  EXPECT_TRUE(p.transfer.ucx_env.empty());
  EXPECT_EQ(p.transfer.node_name, "p");
  EXPECT_EQ(config->decode[0].role, Role::kDecode);
  EXPECT_EQ(config->decode[0].transfer.node_name, "d");
}

TEST(ClusterConfig, ReadsEveryKey) {
  auto config = parse(R"(
model: {preset: tiny, path: /abs/ckpt, dtype: f16, seed: 18446744073709551615, served_name: chat}
router:
  host: 10.1.2.3
  http_port: 9000
  zmq_port: 9001
  control_port: 9002
  policy: round-robin
  max_queued_requests: 7
  request_timeout_ms: 1234
  heartbeat_interval_ms: 50
  heartbeat_timeout_ms: 101
  node_stall_timeout_ms: 0
  min_remote_prefill_tokens: 0
  max_prefill_queue_tokens: 4096
  drain_timeout_ms: 0
  http_threads: 3
  idle_timeout_ms: 5000
  write_timeout_ms: 700
  max_queued_write_bytes: 1048576
  max_unsent_reply_bytes: 2097152
  max_connections: 9
  limits: {max_n: 2, max_batch: 3, max_logprobs: 4, max_stop_strings: 5}
  api_key_file: keys.txt
  control_host: 10.9.9.9
  control_keys: /secrets/control
  zmq_keys: clients
transfer:
  mode: tag
  default_deadline_ms: 10
  close_timeout_ms: 111
  idle_wait_ms: 12
  verify_checksum: false
  peer_error_handling: false
  staging_blocks: 640
  ucx_env: {UCX_TLS: "tcp,self", UCX_RNDV_THRESH: 8192}
prefill: [{name: p, host: node-a.example}]
decode: [{name: d, host: 10.1.2.4}]
)");
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->model.preset, "tiny");
  EXPECT_EQ(config->model.path, fs::path("/abs/ckpt"));
  EXPECT_EQ(config->model.dtype, DType::kF16);
  EXPECT_EQ(config->model.seed, 18446744073709551615ull);
  EXPECT_EQ(config->model.served_name, "chat");
  const RouterSection& r = config->router;
  EXPECT_EQ(r.host, "10.1.2.3");
  EXPECT_EQ(r.http_port, 9000);
  EXPECT_EQ(r.zmq_port, 9001);
  EXPECT_EQ(r.control_port, 9002);
  EXPECT_EQ(r.api_key_file, "/cfg/keys.txt");  // relative paths: against the YAML's directory
  EXPECT_EQ(r.control_host, "10.9.9.9");
  EXPECT_EQ(r.control_keys, "/secrets/control");
  EXPECT_EQ(r.zmq_keys, "/cfg/clients");
  EXPECT_EQ(r.policy, RoutingPolicy::kRoundRobin);
  EXPECT_EQ(r.max_queued_requests, 7);
  EXPECT_EQ(r.request_timeout, std::chrono::milliseconds(1234));
  EXPECT_EQ(r.heartbeat_interval, std::chrono::milliseconds(50));
  EXPECT_EQ(r.heartbeat_timeout, std::chrono::milliseconds(101));
  EXPECT_EQ(r.node_stall_timeout, std::chrono::milliseconds(0));
  EXPECT_EQ(r.min_remote_prefill_tokens, 0);
  EXPECT_EQ(r.max_prefill_queue_tokens, 4096);
  EXPECT_EQ(r.drain_timeout, std::chrono::milliseconds(0));
  EXPECT_EQ(r.http_threads, 3);
  EXPECT_EQ(r.idle_timeout, std::chrono::milliseconds(5000));
  EXPECT_EQ(r.write_timeout, std::chrono::milliseconds(700));
  EXPECT_EQ(r.max_queued_write_bytes, 1048576);
  EXPECT_EQ(r.max_unsent_reply_bytes, 2097152);
  EXPECT_EQ(r.max_connections, 9);
  EXPECT_EQ(r.limits.max_n, 2);
  EXPECT_EQ(r.limits.max_batch, 3);
  EXPECT_EQ(r.limits.max_logprobs, 4);
  EXPECT_EQ(r.limits.max_stop_strings, 5);
  for (const auto* node : {&config->prefill[0], &config->decode[0]}) {
    const kv_transfer::TransferConfig& t = node->transfer;
    EXPECT_EQ(t.mode, kv_transfer::TransferMode::kTag);
    EXPECT_EQ(t.default_deadline, std::chrono::milliseconds(10));
    EXPECT_EQ(t.close_timeout, std::chrono::milliseconds(111));
    EXPECT_EQ(t.idle_wait, std::chrono::milliseconds(12));
    EXPECT_FALSE(t.verify_checksum);
    EXPECT_FALSE(t.peer_error_handling);
    EXPECT_EQ(t.staging_blocks, 640);
    EXPECT_EQ(t.ucx_env.size(), 2u);
    EXPECT_EQ(t.ucx_env.at("UCX_TLS"), "tcp,self");
    EXPECT_EQ(t.ucx_env.at("UCX_RNDV_THRESH"), "8192");
  }
  EXPECT_EQ(config->prefill[0].host, "node-a.example");
  EXPECT_EQ(config->decode[0].host, "10.1.2.4");
  EXPECT_EQ(role_name(Role::kRouter), "router");
  EXPECT_EQ(role_name(Role::kPrefill), "prefill");
  EXPECT_EQ(role_name(Role::kDecode), "decode");
  EXPECT_EQ(routing_policy_name(RoutingPolicy::kRoundRobin), "round-robin");
  EXPECT_EQ(routing_policy_name(RoutingPolicy::kLeastLoaded), "least-loaded");
  EXPECT_EQ(routing_policy_name(RoutingPolicy::kPrefixAware), "prefix-aware");
  auto prefix_aware = parse(kModel + kNodes + "router: {policy: prefix-aware}\n");
  ASSERT_TRUE(prefix_aware.is_ok()) << prefix_aware.status().to_string();
  EXPECT_EQ(prefix_aware->router.policy, RoutingPolicy::kPrefixAware);
}

TEST(ClusterConfig, NodeSettingsOverrideDefaultsKeyByKey) {
  auto config = parse(kModel + R"(
engine: {threads: 2, block_size: 32, kv_cache_bytes: 128MiB, kv_dtype: f16}
transfer: {mode: tag, default_deadline_ms: 100, ucx_env: {UCX_TLS: tcp, UCX_NET_DEVICES: eth0}}
prefill:
  - {name: p0, engine: {kv_cache_bytes: 1GiB, max_num_seqs: 7}}
  - {name: p1, transfer: {mode: rma, ucx_env: {UCX_NET_DEVICES: "mlx5_1:1"}}}
decode:
  - {name: d0, engine: {max_model_len: 512, threads: 4}}
)");
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  const NodeSection& p0 = config->prefill[0];
  EXPECT_EQ(p0.engine.threads, 2);
  EXPECT_EQ(p0.engine.block_size, 32);
  EXPECT_EQ(p0.engine.kv_cache_bytes, 1ull << 30);
  EXPECT_EQ(p0.engine.kv_dtype, DType::kF16);
  EXPECT_EQ(p0.engine.max_num_seqs, 7);
  EXPECT_EQ(p0.transfer.mode, kv_transfer::TransferMode::kTag);

  const NodeSection& p1 = config->prefill[1];
  EXPECT_EQ(p1.engine.kv_cache_bytes, 128ull << 20);
  EXPECT_EQ(p1.engine.kv_dtype, DType::kF16);
  EXPECT_EQ(p1.transfer.mode, kv_transfer::TransferMode::kRma);
  EXPECT_EQ(p1.transfer.default_deadline, std::chrono::milliseconds(100));
  // ucx_env merges too: the node's device, the defaults' transports.
  EXPECT_EQ(p1.transfer.ucx_env.at("UCX_TLS"), "tcp");
  EXPECT_EQ(p1.transfer.ucx_env.at("UCX_NET_DEVICES"), "mlx5_1:1");
  EXPECT_EQ(p0.transfer.ucx_env.at("UCX_NET_DEVICES"), "eth0");

  const NodeSection& d0 = config->decode[0];
  EXPECT_EQ(d0.engine.threads, 4);
  EXPECT_EQ(d0.engine.block_size, 32);
  EXPECT_EQ(d0.engine.max_model_len, 512);
  EXPECT_EQ(d0.engine.kv_cache_bytes, 128ull << 20);
  EXPECT_EQ(d0.transfer.node_name, "d0");
}

TEST(ClusterConfig, NodesWithoutNamesAreNamedByRoleAndIndex) {
  auto config = parse(kModel + "prefill: [{}, {host: 10.0.0.9}]\ndecode: [{}]\n");
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->prefill[0].name, "prefill-0");
  EXPECT_EQ(config->prefill[1].name, "prefill-1");
  EXPECT_EQ(config->prefill[1].host, "10.0.0.9");
  EXPECT_EQ(config->decode[0].name, "decode-0");
  EXPECT_EQ(config->decode[0].transfer.node_name, "decode-0");
}

// No prefill nodes: colocated serving, every decode node prefills its own
// prompts.
TEST(ClusterConfig, PrefillNodesMayBeLeftOut) {
  for (const std::string& prefill :
       {std::string(), std::string("prefill: []\n"), std::string("prefill:\n")}) {
    auto config = parse(kModel + prefill + "decode: [{name: d}, {name: e}]\n");
    ASSERT_TRUE(config.is_ok()) << prefill << config.status().to_string();
    EXPECT_TRUE(config->prefill.empty());
    EXPECT_EQ(config->decode.size(), 2u);
  }
}

TEST(ClusterConfig, FindNode) {
  auto config = parse(kModel + "prefill: [{name: a}, {name: b}]\ndecode: [{name: c}]\n");
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  ASSERT_NE(config->find_node("b"), nullptr);
  EXPECT_EQ(config->find_node("b"), &config->prefill[1]);
  ASSERT_NE(config->find_node("c"), nullptr);
  EXPECT_EQ(config->find_node("c")->role, Role::kDecode);
  EXPECT_EQ(config->find_node("d"), nullptr);
  EXPECT_EQ(config->find_node(""), nullptr);
}

TEST(ClusterConfig, ModelPaths) {
  // Relative paths resolve against the YAML's directory.
  auto config = parse("model: {path: ../models/x}\n" + kNodes, "/etc/baton/configs");
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->model.path, fs::path("/etc/baton/models/x"));
  EXPECT_EQ(config->model.served_name, "x");

  // Absolute paths stay; a trailing slash does not make the served name empty.
  config = parse("model: {path: /data/ckpt/llama/}\n" + kNodes, "/etc/baton");
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->model.path, fs::path("/data/ckpt/llama"));
  EXPECT_EQ(config->model.served_name, "llama");

  // A preset alone: models/<preset> next to the YAML.
  config = parse("model: {preset: smollm2-135m}\n" + kNodes, "/srv/cfg");
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->model.path, fs::path("/srv/cfg/models/smollm2-135m"));
  EXPECT_EQ(config->model.served_name, "smollm2-135m");
  EXPECT_EQ(config->model.preset, "smollm2-135m");
}

TEST(ClusterConfig, SsdTierDirectoriesResolveAgainstTheYamlsDirectory) {
  auto config = parse(kModel +
                          "engine: {ssd_cache_dir: kv-ssd}\n"
                          "prefill: [{name: p}]\n"
                          "decode: [{name: d, engine: {ssd_cache_dir: /mnt/nvme/kv}}, {name: e}]\n",
                      "/etc/baton");
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->prefill[0].engine.ssd_cache_dir, "/etc/baton/kv-ssd");
  EXPECT_EQ(config->decode[0].engine.ssd_cache_dir, "/mnt/nvme/kv");
  EXPECT_EQ(config->decode[1].engine.ssd_cache_dir, "/etc/baton/kv-ssd");
  config = parse(kModel + kNodes, "/etc/baton");
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_TRUE(config->decode[0].engine.ssd_cache_dir.empty()) << "off unless set";
}

TEST(ClusterConfig, LoadResolvesAgainstTheFilesDirectoryAndNamesTheFile) {
  fs::path dir = fs::temp_directory_path() / ("baton-cluster-" + std::to_string(getpid()));
  fs::create_directories(dir / "conf");
  fs::path file = dir / "conf" / "c.yaml";
  {
    std::ofstream out(file);
    out << "model: {path: ../ckpt}\n" << kNodes;
  }
  auto config = load_cluster_config(file);
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->file, file);
  EXPECT_EQ(config->model.path, dir / "ckpt");

  {
    std::ofstream out(file);
    out << "model: {path: ../ckpt}\nrouter: {http_port: 0}\n" << kNodes;
  }
  config = load_cluster_config(file);
  ASSERT_FALSE(config.is_ok());
  EXPECT_NE(config.status().message().find(file.string()), std::string::npos)
      << config.status().message();
  EXPECT_NE(config.status().message().find("router.http_port"), std::string::npos)
      << config.status().message();

  {
    std::ofstream out(file);
    out << "model: {path: [unclosed\n";
  }
  config = load_cluster_config(file);
  ASSERT_FALSE(config.is_ok());
  EXPECT_NE(config.status().message().find(file.string()), std::string::npos);

  config = load_cluster_config(dir / "missing.yaml");
  ASSERT_FALSE(config.is_ok());
  EXPECT_EQ(config.status().code(), StatusCode::kNotFound);
  fs::remove_all(dir);
}

TEST(ClusterConfig, ErrorsNameTheKey) {
  const std::string node_d = "decode: [{name: d}]\n";
  const std::string node_p = "prefill: [{name: p}]\n";
  struct Case {
    std::string yaml;
    std::string expected;
  } cases[] = {
      // Unknown keys, at every level.
      {kModel + kNodes + "modle: {}\n", "modle: unknown key"},
      {kModel + kNodes + "router: {http_prot: 1}\n", "router.http_prot: unknown key"},
      {kModel + kNodes + "router: {limits: {max_m: 1}}\n", "router.limits.max_m: unknown key"},
      {"model: {path: m, dtyp: bf16}\n" + kNodes, "model.dtyp: unknown key"},
      {kModel + node_d + "prefill: [{name: p, port: 9000}]\n", "prefill[0].port: unknown key"},
      {kModel + node_p + "decode: [{name: d}, {name: e, engine: {blok_size: 16}}]\n",
       "decode[1].engine.blok_size: unknown key"},
      {kModel + kNodes + "engine: {blok_size: 16}\n", "engine.blok_size: unknown key"},
      {kModel + kNodes + "transfer: {deadline_ms: 1}\n", "transfer.deadline_ms: unknown key"},
      {kModel + node_p + "decode: [{name: d, transfer: {moed: tag}}]\n",
       "decode[0].transfer.moed: unknown key"},
      // Wrong types and out-of-range values.
      {kModel + node_p + "decode: [{name: d}, {name: e, engine: {block_size: 24}}]\n",
       "decode[1].engine.block_size: must be a power of two"},
      {kModel + kNodes + "engine: {kv_cache_bytes: lots}\n", "engine.kv_cache_bytes"},
      {kModel + node_p + "decode: [{name: d, engine: {device: tpu}}]\n",
       "decode[0].engine.device: expected cpu, cuda or cuda:N"},
      // A CPU node and a GPU node cannot share KV blocks: both are named.
      {kModel + node_p + "decode: [{name: d, engine: {device: 'cuda:1'}}]\n",
       "decode[0].engine.device: d computes on cuda:1, p (prefill[0]) on cpu"},
      {kModel + "engine: {device: cuda}\nprefill: [{name: p}]\n" +
           "decode: [{name: d, engine: {device: cpu}}]\n",
       "decode[0].engine.device: d computes on cpu, p (prefill[0]) on cuda:0"},
      {kModel + kNodes + "router: {http_port: 0}\n", "router.http_port: must be in [1, 65535]"},
      {kModel + kNodes + "router: {zmq_port: 65536}\n", "router.zmq_port: must be in"},
      {kModel + kNodes + "router: {control_port: abc}\n",
       "router.control_port: expected an integer"},
      {kModel + kNodes + "router: {http_port: [1]}\n", "router.http_port: expected an integer"},
      {kModel + kNodes + "router: {policy: random}\n", "router.policy: expected round-robin"},
      {kModel + kNodes + "router: {host: ''}\n", "router.host"},
      {kModel + kNodes + "router: {host: 'a b'}\n", "router.host"},
      {kModel + kNodes + "router: {max_queued_requests: 0}\n", "router.max_queued_requests"},
      {kModel + kNodes + "router: {request_timeout_ms: -1}\n", "router.request_timeout_ms"},
      {kModel + kNodes + "router: {drain_timeout_ms: x}\n", "router.drain_timeout_ms"},
      {kModel + kNodes + "router: {node_stall_timeout_ms: -5}\n", "router.node_stall_timeout_ms"},
      {kModel + kNodes + "router: {node_stall_timeout_ms: 999}\n",
       "router.node_stall_timeout_ms: 0 (never) or at least 1000, got 999"},
      {kModel + kNodes +
           "engine: {min_step_interval_ms: 600}\nrouter: {node_stall_timeout_ms: 1200}\n",
       "must exceed twice the engine.min_step_interval_ms of node"},
      {kModel + kNodes + "router: {http_threads: 0}\n", "router.http_threads"},
      {kModel + kNodes + "router: {write_timeout_ms: 0}\n", "router.write_timeout_ms"},
      {kModel + kNodes + "router: {max_queued_write_bytes: 100}\n",
       "router.max_queued_write_bytes: must be in"},
      {kModel + kNodes + "router: {max_unsent_reply_bytes: 1000}\n",
       "router.max_unsent_reply_bytes: must be in"},
      {kModel + kNodes + "router: {max_connections: -1}\n", "router.max_connections"},
      {kModel + kNodes + "router: {min_remote_prefill_tokens: -1}\n",
       "router.min_remote_prefill_tokens"},
      {kModel + kNodes + "router: {max_prefill_queue_tokens: -5}\n",
       "router.max_prefill_queue_tokens"},
      {kModel + kNodes + "router: {limits: {max_n: 0}}\n", "router.limits.max_n"},
      {kModel + kNodes + "router: {limits: {max_batch: 0}}\n", "router.limits.max_batch"},
      {kModel + kNodes + "router: {limits: {max_logprobs: -1}}\n", "router.limits.max_logprobs"},
      {kModel + kNodes + "router: {limits: {max_stop_strings: x}}\n",
       "router.limits.max_stop_strings"},
      {kModel + kNodes + "router: {limits: 5}\n", "router.limits: expected a mapping"},
      {kModel + kNodes + "router: 5\n", "router: expected a mapping"},
      {kModel + kNodes + "router: {http_port: 1, http_port: 2}\n", "router.http_port: given twice"},
      {kModel + kNodes + "transfer: {mode: fast}\n",
       "transfer.mode: expected auto, rma, tag or am"},
      {kModel + kNodes + "transfer: {default_deadline_ms: 0}\n", "transfer.default_deadline_ms"},
      {kModel + kNodes + "transfer: {close_timeout_ms: 0}\n", "transfer.close_timeout_ms"},
      {kModel + kNodes + "transfer: {close_timeout_ms: 99}\n", "transfer.close_timeout_ms"},
      {kModel + kNodes + "transfer: {idle_wait_ms: -5}\n", "transfer.idle_wait_ms"},
      {kModel + kNodes + "transfer: {verify_checksum: maybe}\n",
       "transfer.verify_checksum: expected true or false"},
      {kModel + kNodes + "transfer: {peer_error_handling: 1}\n", "transfer.peer_error_handling"},
      {kModel + kNodes + "transfer: {staging_blocks: -1}\n", "transfer.staging_blocks"},
      {kModel + kNodes + "transfer: {ucx_env: {TLS: tcp}}\n",
       "transfer.ucx_env.TLS: UCX variables start with UCX_"},
      {kModel + kNodes + "transfer: {ucx_env: {UCX_: tcp}}\n", "transfer.ucx_env.UCX_"},
      {kModel + kNodes + "transfer: {ucx_env: {UCX_TLS: [tcp]}}\n",
       "transfer.ucx_env.UCX_TLS: expected a value"},
      {kModel + kNodes + "transfer: {ucx_env: tcp}\n", "transfer.ucx_env: expected a mapping"},
      {kModel + node_d + "prefill: [{name: p, transfer: {ucx_env: {NET: x}}}]\n",
       "prefill[0].transfer.ucx_env.NET"},
      {kModel + node_d + "prefill: [{name: p, engine: 5}]\n",
       "prefill[0].engine: expected a mapping"},
      {kModel + node_d + "prefill: [{name: p, host: ''}]\n", "prefill[0].host"},
      {kModel + node_d + "prefill: [{name: 'a b'}]\n", "prefill[0].name"},
      {kModel + node_d + "prefill: [{name: [x]}]\n", "prefill[0].name"},
      {kModel + node_d + "prefill: [5]\n", "prefill[0]: expected a mapping"},
      {kModel + node_d + "prefill: {name: p}\n", "prefill: expected a list"},
      {"model: {path: m, dtype: f64}\n" + kNodes, "model.dtype: expected f32, bf16 or f16"},
      {"model: {path: m, seed: -1}\n" + kNodes, "model.seed"},
      {"model: {path: ''}\n" + kNodes, "model.path"},
      {"model: {path: m, served_name: ''}\n" + kNodes, "model.served_name"},
      {"model: [m]\n" + kNodes, "model: expected a mapping"},
      {"[1, 2]", "top level: expected a mapping"},
      // Nodes.
      {kModel + node_p, "decode: at least one node is required"},
      {kModel + node_p + "decode:\n", "decode: at least one node is required"},
      {kModel + "prefill: [{name: x}]\ndecode: [{name: x}]\n",
       "decode[0].name: 'x' is already the name of prefill[0]"},
      {kModel + node_d + "prefill: [{name: a}, {name: a}]\n",
       "prefill[1].name: 'a' is already the name of prefill[0]"},
      {kModel + node_d + "prefill: [{}, {name: prefill-0}]\n",
       "prefill[1].name: 'prefill-0' is already the name of prefill[0]"},
      // Ports and heartbeats.
      {kModel + kNodes + "router: {zmq_port: 8000}\n",
       "router.zmq_port: port 8000 on 127.0.0.1 is already router.http_port"},
      {kModel + kNodes + "router: {control_port: 9000, zmq_port: 9000}\n",
       "router.control_port: port 9000 on 127.0.0.1 is already router.zmq_port"},
      {kModel + kNodes + "router: {heartbeat_interval_ms: 500, heartbeat_timeout_ms: 1000}\n",
       "router.heartbeat_timeout_ms: must exceed 2 x heartbeat_interval_ms (1000), got 1000"},
      {kModel + kNodes + "router: {heartbeat_interval_ms: 1500}\n",
       "router.heartbeat_timeout_ms: must exceed"},
      // The model.
      {kNodes, "model: needs path"},
      {"model: {dtype: bf16}\n" + kNodes, "model: needs path"},
      {"model: {preset: gpt-9}\n" + kNodes,
       "model.preset: unknown preset 'gpt-9' (known: tiny, tiny-qwen2, tiny-qwen3, "},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.yaml);
    expect_error(parse(c.yaml), c.expected, c.yaml);
  }
}

TEST(ClusterConfig, ErrorsInTheDefaultsNameTheDefaults) {
  // The top-level engine mapping is wrong, not the node's: say so.
  auto config = parse(kModel + kNodes + "engine: {block_size: 3}\n");
  expect_error(config, "engine.block_size", "");
  EXPECT_EQ(config.status().message().rfind("engine.block_size", 0), 0u)
      << config.status().message();
  config = parse(kModel + kNodes + "transfer: {mode: x}\n");
  expect_error(config, "transfer.mode", "");
  EXPECT_EQ(config.status().message().rfind("transfer.mode", 0), 0u) << config.status().message();
}

TEST(ClusterConfig, BoundariesThatPass) {
  // Just over two intervals; the same port on the router's three front ends is the error,
  // different ones are fine; the same host for every node is fine.
  auto config = parse(kModel + kNodes +
                      "router: {heartbeat_interval_ms: 500, heartbeat_timeout_ms: 1001,"
                      " http_port: 1, zmq_port: 65535, control_port: 2}\n");
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->router.heartbeat_timeout, std::chrono::milliseconds(1001));
  EXPECT_EQ(config->router.zmq_port, 65535);
}

TEST(TransferConfig, ParsesOnItsOwn) {
  auto config = parse_transfer_config(YAML::Load("{mode: am, idle_wait_ms: 5}"), "kv");
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->mode, kv_transfer::TransferMode::kAm);
  EXPECT_EQ(config->idle_wait, std::chrono::milliseconds(5));
  auto defaults = parse_transfer_config(YAML::Node(), "kv");
  ASSERT_TRUE(defaults.is_ok());
  EXPECT_EQ(defaults->mode, kv_transfer::TransferMode::kAuto);
  auto bad = parse_transfer_config(YAML::Load("{mode: rdma}"), "node.kv");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message().rfind("node.kv.mode: ", 0), 0u) << bad.status().message();
}

// --- validate_against_model --------------------------------------------------

// smollm2-135m in bf16: 30 layers x 2 x 3 KV heads x 64 x 2 bytes = 23040 bytes of KV
// per token, 368640 per 16-token block.
constexpr uint64_t kSmolBlockBytes = 368640;

Result<ClusterConfig> smol_cluster(const std::string& decode_engine,
                                   const std::string& prefill_engine = "{}") {
  return parse("model: {preset: smollm2-135m}\nprefill: [{name: p0}, {name: p1, engine: " +
               prefill_engine + "}]\ndecode: [{name: d0, engine: " + decode_engine + "}]\n");
}

TEST(ValidateAgainstModel, DefaultsHoldAFullLengthRequest) {
  // 256MiB: 728 blocks, 11648 tokens >= max_position_embeddings 8192.
  auto config = smol_cluster("{}");
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  Status status = validate_against_model(*config, preset("smollm2-135m", DType::kBF16));
  EXPECT_TRUE(status.is_ok()) << status.to_string();
}

TEST(ValidateAgainstModel, PoolTooSmallNamesTheNodesKey) {
  auto config = smol_cluster("{kv_cache_bytes: 1MiB, max_model_len: 2048}");
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  Status status = validate_against_model(*config, preset("smollm2-135m", DType::kBF16));
  ASSERT_FALSE(status.is_ok());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  // 1MiB / 368640 = 2 blocks = 32 tokens.
  EXPECT_EQ(status.message().rfind("decode[0].engine.kv_cache_bytes: 1MiB holds 32 tokens of "
                                   "smollm2-135m's KV, less than one 2048-token request",
                                   0),
            0u)
      << status.message();
  EXPECT_NE(status.message().find("128 blocks"), std::string::npos) << status.message();
  // 30 layers, K and V of 3 heads of 64 dims in BF16.
  EXPECT_NE(status.message().find("in bf16 at 23040 bytes a token"), std::string::npos)
      << status.message();
}

// With a window on every layer a request holds only its windows and a
// step: a pool of that many blocks serves the whole context.
TEST(ValidateAgainstModel, SlidingWindowsNeedOnlyWhatARequestHoldsAtOnce) {
  auto model = preset("smollm2-135m", DType::kBF16);  // 8192 positions
  // 1024-token windows, 2048-token steps (the default), 16-token blocks:
  // (1023 + 2048 + 15) / 16 + 1 = 193 blocks.
  for (int32_t blocks : {193, 192}) {
    SCOPED_TRACE(std::to_string(blocks) + " blocks");
    auto config = smol_cluster("{kv_cache_blocks: " + std::to_string(blocks) + "}");
    ASSERT_TRUE(config.is_ok()) << config.status().to_string();
    model.layer_windows.clear();
    EXPECT_FALSE(validate_against_model(*config, model).is_ok()) << "no windows: 512 blocks";
    model.layer_windows.assign(size_t(model.num_layers), 1024);
    const Status status = validate_against_model(*config, model);
    if (blocks == 193) {
      EXPECT_TRUE(status.is_ok()) << status.to_string();
    } else {
      EXPECT_NE(status.message().find("less than the 3088 tokens a request holds at once (its "
                                      "1024-token sliding windows and a step of 2048 tokens)"),
                std::string::npos)
          << status.message();
    }
  }
}

TEST(ValidateAgainstModel, ExactFitPassesOneByteLessFails) {
  const auto model = preset("smollm2-135m", DType::kBF16);
  const uint64_t exact = 128 * kSmolBlockBytes;  // 2048 tokens
  auto fits = smol_cluster("{kv_cache_bytes: " + std::to_string(exact) + ", max_model_len: 2048}");
  ASSERT_TRUE(fits.is_ok()) << fits.status().to_string();
  EXPECT_TRUE(validate_against_model(*fits, model).is_ok());
  auto short_by_one =
      smol_cluster("{kv_cache_bytes: " + std::to_string(exact - 1) + ", max_model_len: 2048}");
  ASSERT_TRUE(short_by_one.is_ok());
  Status status = validate_against_model(*short_by_one, model);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("decode[0].engine.kv_cache_bytes: 47185919 bytes holds 2032"),
            std::string::npos)
      << status.message();
  // A partly used last block still needs the whole block.
  auto ragged = smol_cluster("{kv_cache_bytes: " + std::to_string(exact - kSmolBlockBytes) +
                             ", max_model_len: 2033}");
  ASSERT_TRUE(ragged.is_ok());
  EXPECT_FALSE(validate_against_model(*ragged, model).is_ok());
}

// A device pool's transfers hold a host slot per block: fewer slots than a
// max_model_len prompt's blocks could never carry it. A CPU node's pool is
// registered in place, and the setting means nothing to it.
TEST(ValidateAgainstModel, StagingSlotsHoldAFullLengthPrompt) {
  const auto model = preset("smollm2-135m", DType::kBF16);
  for (const std::string device : {"cuda", "cpu"}) {
    for (int32_t slots : {128, 127}) {
      SCOPED_TRACE(device + ", " + std::to_string(slots) + " slots");
      auto config =
          parse("model: {preset: smollm2-135m}\nengine: {max_model_len: 2048, device: " + device +
                "}\nprefill: [{name: p0}]\ndecode: [{name: d0, transfer: " + "{staging_blocks: " +
                std::to_string(slots) + "}}]\n");
      ASSERT_TRUE(config.is_ok()) << config.status().to_string();
      Status status = validate_against_model(*config, model);
      if (slots == 128 || device == "cpu") {
        EXPECT_TRUE(status.is_ok()) << status.to_string();
      } else {
        EXPECT_EQ(status.message(),
                  "decode[0].transfer.staging_blocks: 127 host slots cannot carry the longest "
                  "prompt's KV, 2048 tokens, which needs 128 blocks");
      }
    }
  }
}

TEST(ValidateAgainstModel, KvCacheBlocksTakePrecedence) {
  const auto model = preset("smollm2-135m", DType::kBF16);
  auto config = smol_cluster("{}", "{kv_cache_blocks: 127, max_model_len: 2048}");
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  Status status = validate_against_model(*config, model);
  ASSERT_FALSE(status.is_ok());
  EXPECT_EQ(
      status.message().rfind("prefill[1].engine.kv_cache_blocks: 127 blocks hold 2032 tokens", 0),
      0u)
      << status.message();
  config = smol_cluster("{}", "{kv_cache_blocks: 128, max_model_len: 2048, kv_cache_bytes: 1KiB}");
  ASSERT_TRUE(config.is_ok());
  EXPECT_TRUE(validate_against_model(*config, model).is_ok());
}

TEST(ValidateAgainstModel, KvDtypeAndBlockSizeCount) {
  const uint64_t exact = 128 * kSmolBlockBytes;  // 2048 bf16 tokens
  const std::string engine = "kv_cache_bytes: " + std::to_string(exact) + ", max_model_len: 2048";
  // KV dtype and block size are cluster-wide (every node shares the layout).
  auto smol_with_defaults = [](const std::string& defaults) {
    return parse("model: {preset: smollm2-135m}\nengine: " + defaults +
                 "\nprefill: [{name: p0}]\ndecode: [{name: d0}]\n");
  };
  // f32 KV takes twice the bytes.
  auto config = smol_with_defaults("{" + engine + ", kv_dtype: f32}");
  ASSERT_TRUE(config.is_ok());
  EXPECT_FALSE(validate_against_model(*config, preset("smollm2-135m", DType::kBF16)).is_ok());
  // auto: the checkpoint's dtype.
  config = smol_with_defaults("{" + engine + "}");
  ASSERT_TRUE(config.is_ok());
  EXPECT_TRUE(validate_against_model(*config, preset("smollm2-135m", DType::kBF16)).is_ok());
  Status f32 = validate_against_model(*config, preset("smollm2-135m", DType::kF32));
  ASSERT_FALSE(f32.is_ok());
  EXPECT_NE(f32.message().find("in f32"), std::string::npos) << f32.message();
  // Bigger blocks: the same bytes, counted in 256-token blocks (8 of them).
  config = smol_with_defaults("{" + engine + ", block_size: 256}");
  ASSERT_TRUE(config.is_ok());
  EXPECT_TRUE(validate_against_model(*config, preset("smollm2-135m", DType::kBF16)).is_ok());
}

TEST(ValidateAgainstModel, MaxModelLenWithinPositionEmbeddings) {
  const auto model = preset("smollm2-135m", DType::kBF16);
  auto config = smol_cluster("{max_model_len: 8193, kv_cache_bytes: 1GiB}");
  ASSERT_TRUE(config.is_ok());
  Status status = validate_against_model(*config, model);
  ASSERT_FALSE(status.is_ok());
  EXPECT_EQ(status.message(),
            "decode[0].engine.max_model_len: 8193 exceeds smollm2-135m's "
            "max_position_embeddings 8192");
  config = smol_cluster("{max_model_len: 8192, kv_cache_bytes: 1GiB}");
  ASSERT_TRUE(config.is_ok());
  EXPECT_TRUE(validate_against_model(*config, model).is_ok());
}

// --- the shipped configs ------------------------------------------------------

fs::path shipped(const char* name) { return fs::path(BATON_SOURCE_DIR) / "configs" / name; }

Status validate_shipped(const ClusterConfig& config) {
  auto model = engine::model_preset(config.model.preset);
  if (!model.is_ok()) return model.status();
  model->torch_dtype = config.model.dtype;
  return validate_against_model(config, *model);
}

TEST(ShippedConfigs, LocalLoadsAndFitsItsModel) {
  auto config = load_cluster_config(shipped("local.yaml"));
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->model.preset, "smollm2-135m");
  EXPECT_EQ(config->model.path,
            (fs::path(BATON_SOURCE_DIR) / "models" / "smollm2-135m").lexically_normal());
  EXPECT_EQ(config->model.served_name, "smollm2-135m");
  EXPECT_EQ(config->model.dtype, DType::kBF16);
  EXPECT_EQ(config->router.host, "127.0.0.1");
  ASSERT_EQ(config->prefill.size(), 1u);
  ASSERT_EQ(config->decode.size(), 1u);
  EXPECT_EQ(config->prefill[0].name, "prefill-0");
  EXPECT_EQ(config->decode[0].name, "decode-0");
  for (const auto* node : {&config->prefill[0], &config->decode[0]}) {
    EXPECT_EQ(node->host, "127.0.0.1");
    EXPECT_EQ(node->engine.kv_cache_bytes, 256ull << 20);
  }
  // The two nodes share the host's cores: the prefill node takes every core
  // the decode node's steps leave, at a lower priority.
  EXPECT_EQ(config->prefill[0].engine.threads, 0);
  EXPECT_EQ(config->prefill[0].engine.nice, 10);
  EXPECT_EQ(config->decode[0].engine.threads, 1);
  EXPECT_EQ(config->decode[0].engine.nice, 0);
  Status status = validate_shipped(*config);
  EXPECT_TRUE(status.is_ok()) << status.to_string();
}

TEST(ShippedConfigs, TwoPrefillTwoDecodeLoadsAndFitsItsModel) {
  auto config = load_cluster_config(shipped("local-2p2d.yaml"));
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  ASSERT_EQ(config->prefill.size(), 2u);
  ASSERT_EQ(config->decode.size(), 2u);
  for (const char* name : {"prefill-0", "prefill-1", "decode-0", "decode-1"}) {
    const NodeSection* node = config->find_node(name);
    ASSERT_NE(node, nullptr) << name;
    EXPECT_EQ(node->host, "127.0.0.1");
    EXPECT_EQ(node->engine.threads, 1);
  }
  EXPECT_EQ(config->decode[1].engine.kv_cache_bytes, 512ull << 20);
  EXPECT_EQ(config->prefill[1].engine.kv_cache_bytes, 256ull << 20);
  Status status = validate_shipped(*config);
  EXPECT_TRUE(status.is_ok()) << status.to_string();
}

TEST(ShippedConfigs, OneGpuLoadsAndFitsItsModel) {
  auto config = load_cluster_config(shipped("gpu-1p1d.yaml"));
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->model.preset, "llama3-8b");
  ASSERT_EQ(config->prefill.size(), 1u);
  ASSERT_EQ(config->decode.size(), 1u);
  for (const auto* node : {&config->prefill[0], &config->decode[0]}) {
    EXPECT_EQ(node->engine.device.name(), "cuda:0") << node->name;
    EXPECT_EQ(node->engine.kv_dtype, DType::kBF16) << node->name;
  }
  // Their parts of the one GPU, the decode node's batch the larger.
  EXPECT_EQ(config->prefill[0].engine.memory_fraction, 0.4);
  EXPECT_EQ(config->decode[0].engine.memory_fraction, 0.5);
  Status status = validate_shipped(*config);
  EXPECT_TRUE(status.is_ok()) << status.to_string();
}

// The colocated configs have no prefill node: their decode nodes prefill.
TEST(ShippedConfigs, ColocatedConfigsLoadAndFitTheirModels) {
  auto local = load_cluster_config(shipped("local-colocated.yaml"));
  ASSERT_TRUE(local.is_ok()) << local.status().to_string();
  EXPECT_TRUE(local->prefill.empty());
  ASSERT_EQ(local->decode.size(), 2u);
  EXPECT_EQ(local->decode[1].engine.max_num_batched_tokens, 256);
  Status status = validate_shipped(*local);
  EXPECT_TRUE(status.is_ok()) << status.to_string();

  auto gpu = load_cluster_config(shipped("gpu-colocated.yaml"));
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
  EXPECT_EQ(gpu->model.preset, "llama3-8b");
  EXPECT_TRUE(gpu->prefill.empty());
  ASSERT_EQ(gpu->decode.size(), 1u);
  EXPECT_EQ(gpu->decode[0].engine.device.name(), "cuda:0");
  EXPECT_EQ(gpu->decode[0].engine.memory_fraction, 0.9);
  status = validate_shipped(*gpu);
  EXPECT_TRUE(status.is_ok()) << status.to_string();
}

TEST(ShippedConfigs, MultiHostLoadsAndFitsItsModel) {
  auto config = load_cluster_config(shipped("multi-host.yaml"));
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->router.host, "10.0.0.1");
  ASSERT_EQ(config->prefill.size(), 2u);
  ASSERT_EQ(config->decode.size(), 2u);
  EXPECT_EQ(config->prefill[0].host, "10.0.0.2");
  EXPECT_EQ(config->prefill[1].host, "10.0.0.3");
  EXPECT_EQ(config->decode[0].host, "10.0.0.4");
  EXPECT_EQ(config->decode[1].host, "10.0.0.5");
  // prefill-1 overrides only the NIC; the transports come from the defaults.
  EXPECT_EQ(config->prefill[0].transfer.ucx_env.at("UCX_NET_DEVICES"), "mlx5_0:1");
  EXPECT_EQ(config->prefill[1].transfer.ucx_env.at("UCX_NET_DEVICES"), "mlx5_1:1");
  EXPECT_EQ(config->prefill[1].transfer.ucx_env.at("UCX_TLS"),
            config->prefill[0].transfer.ucx_env.at("UCX_TLS"));
  Status status = validate_shipped(*config);
  EXPECT_TRUE(status.is_ok()) << status.to_string();
}

TEST(ShippedConfigs, MultiHostGpuLoadsAndFitsItsModel) {
  auto config = load_cluster_config(shipped("multi-host-gpu.yaml"));
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->router.host, "10.0.0.1");
  ASSERT_EQ(config->prefill.size(), 2u);
  ASSERT_EQ(config->decode.size(), 2u);
  // A node per GPU, two to a host, each with the NIC beside its GPU.
  for (const auto& nodes : {config->prefill, config->decode}) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      const NodeSection& node = nodes[i];
      EXPECT_EQ(node.host, nodes[0].host) << node.name;
      EXPECT_EQ(node.engine.device.name(), "cuda:" + std::to_string(i)) << node.name;
      EXPECT_EQ(node.engine.kv_dtype, DType::kBF16) << node.name;
      EXPECT_EQ(node.engine.memory_fraction, 0.9) << node.name;
      EXPECT_EQ(node.transfer.ucx_env.at("UCX_NET_DEVICES"), "mlx5_" + std::to_string(i) + ":1")
          << node.name;
      EXPECT_EQ(node.transfer.ucx_env.at("UCX_TLS"), "rc,ud,sm,self") << node.name;
    }
  }
  EXPECT_NE(config->prefill[0].host, config->decode[0].host);
  Status status = validate_shipped(*config);
  EXPECT_TRUE(status.is_ok()) << status.to_string();
}

TEST(ClusterConfigKvLayout, NodesMustShareBlockSizeKvDtypeAndDeviceKind) {
  std::string base = "model: {preset: tiny}\nprefill: [{name: p}]\n";
  auto block = parse(base + "decode: [{name: d, engine: {block_size: 32}}]\n");
  ASSERT_FALSE(block.is_ok());
  EXPECT_NE(
      block.status().message().find("decode[0].engine.block_size: 32 differs from prefill[0]'s 16"),
      std::string::npos)
      << block.status().message();
  auto dtype = parse(base + "decode: [{name: d, engine: {kv_dtype: bf16}}]\n");
  ASSERT_FALSE(dtype.is_ok());
  EXPECT_NE(dtype.status().message().find(
                "decode[0].engine.kv_dtype: bf16 differs from prefill[0]'s auto"),
            std::string::npos)
      << dtype.status().message();
  EXPECT_TRUE(parse("model: {preset: tiny}\nengine: {kv_dtype: bf16, block_size: 32}\nprefill: "
                    "[{name: p}]\n"
                    "decode: [{name: d}]\n")
                  .is_ok());
  // GPU nodes together, each on a device of its own.
  auto gpus = parse(
      "model: {preset: tiny}\nengine: {device: cuda}\nprefill: [{name: p}]\n"
      "decode: [{name: d, engine: {device: 'cuda:1'}}]\n");
  ASSERT_TRUE(gpus.is_ok()) << gpus.status().message();
  EXPECT_EQ(gpus->prefill[0].engine.device.name(), "cuda:0");
  EXPECT_EQ(gpus->decode[0].engine.device.name(), "cuda:1");
}

// Nodes on one device of one host share its memory: their parts of it add
// up to all of it at most.
TEST(ClusterConfigMemory, FractionsOfOneDeviceAddUpToItAtMost) {
  auto cluster = [](const std::string& prefill, const std::string& decode) {
    return parse(
        "model: {preset: tiny}\nengine: {device: cuda}\nprefill: [{name: p, host: h1, "
        "engine: {" +
        prefill + "}}]\ndecode: [{name: d, host: h1, engine: {" + decode + "}}]\n");
  };
  const std::string both = "memory_fraction: 0.5";
  expect_error(cluster(both, "memory_fraction: 0.6"),
               "decode[0].engine.memory_fraction: p, d share cuda:0 on h1 and ask for 0.5 + 0.6 "
               "of its memory, more than all of it",
               "0.5 + 0.6");
  for (const auto& [prefill, decode] : std::vector<std::pair<std::string, std::string>>{
           {both, both},
           {"memory_fraction: 0.45", "memory_fraction: 0.45"},
           {"memory_fraction: 0.7", "memory_fraction: 0.3"},
           // A pool sized in blocks takes no share.
           {"memory_fraction: 0.9", "memory_fraction: 0.9, kv_cache_blocks: 100"},
           // Two devices, or one without a share.
           {"memory_fraction: 0.9", "memory_fraction: 0.9, device: 'cuda:1'"},
           {"memory_fraction: 1", "kv_cache_bytes: 1GiB"}}) {
    auto config = cluster(prefill, decode);
    EXPECT_TRUE(config.is_ok()) << prefill << " / " << decode << ": " << config.status().message();
  }
  // The loopback names are one host.
  expect_error(parse("model: {preset: tiny}\nengine: {memory_fraction: 0.6}\nprefill: [{name: p, "
                     "host: 127.0.0.1}]\ndecode: [{name: d, host: localhost}]\n"),
               "decode[0].engine.memory_fraction: p, d share cpu on this host and ask for 0.6 + "
               "0.6",
               "127.0.0.1 and localhost");
  // Two hosts' devices are two devices.
  auto hosts = parse(
      "model: {preset: tiny}\nengine: {device: cuda, memory_fraction: 0.9}\n"
      "prefill: [{name: p, host: h1}]\ndecode: [{name: d, host: h2}]\n");
  EXPECT_TRUE(hosts.is_ok()) << hosts.status().message();
  // Three nodes on one host's CPUs: the third is named.
  expect_error(parse("model: {preset: tiny}\nengine: {memory_fraction: 0.4}\nprefill: [{name: "
                     "p, host: h1}]\ndecode: [{name: d0, host: h1}, {name: d1, host: h1}]\n"),
               "decode[1].engine.memory_fraction: p, d0, d1 share cpu on h1 and ask for 0.4 + "
               "0.4 + 0.4",
               "three CPU nodes");
}

// A share of a device is sized where the device is: `baton up` does not
// hold it against the model beforehand.
TEST(ValidateAgainstModel, AMemoryFractionIsSizedAtStart) {
  auto config = smol_cluster("{kv_cache_bytes: 1MiB, max_model_len: 2048, memory_fraction: 0.3}");
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  Status status = validate_against_model(*config, preset("smollm2-135m", DType::kBF16));
  EXPECT_TRUE(status.is_ok()) << status.to_string();
}

}  // namespace
}  // namespace baton::cluster

// tests/integration/cluster_harness.cc
#include "tests/integration/cluster_harness.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "engine/make_model.h"

namespace baton::testing {

using namespace std::chrono_literals;
using json = nlohmann::json;

namespace {

bool bindable(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  ::close(fd);
  return ok;
}

// The first port the OS hands out by itself (to bind(0) and to outgoing
// connections); 32768 where it cannot be read.
int ephemeral_start() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int first = 32768;
  in >> first;
  return in ? first : 32768;
}

}  // namespace

uint16_t free_port() {
  // A port the OS reports free can be taken again before the router binds
  // it: by another test process's router, or as the local port of any
  // outgoing connection. So ports come from below the ephemeral range, which
  // the OS never hands out by itself, and each is claimed with a lock file
  // held until this process exits, so test processes running side by side
  // never pick the same one.
  static std::mutex mutex;
  static std::set<uint16_t> handed_out;
  static std::mt19937 rng(std::random_device{}());
  std::lock_guard lock(mutex);
  const int low = 10000, high = std::min(ephemeral_start(), 32768);
  const auto dir = std::filesystem::temp_directory_path() / "baton-test-ports";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  for (int attempt = 0; high - low >= 1000 && attempt < 10000; ++attempt) {
    const auto port = uint16_t(low + int(rng() % uint32_t(high - low)));
    if (handed_out.count(port) != 0) continue;
    const int claim =
        ::open((dir / std::to_string(port)).c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0666);
    if (claim < 0) continue;
    if (::flock(claim, LOCK_EX | LOCK_NB) != 0 || !bindable(port)) {
      ::close(claim);
      continue;
    }
    handed_out.insert(port);  // `claim` stays open: the lock lasts as long as this process
    return port;
  }
  ADD_FAILURE() << "no free port below the ephemeral range (" << low << ".." << high << ")";
  return 0;
}

const std::filesystem::path& tiny_model() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("baton-it-model-" + std::to_string(::getpid()) +
                                                  "-" + std::to_string(std::random_device{}()));
    auto config = engine::model_preset("tiny");
    EXPECT_TRUE(config.is_ok());
    engine::MakeModelOptions options;
    options.seed = std::random_device{}();
    options.dtype = DType::kF32;
    Status made = engine::make_random_checkpoint(*config, path, options);
    EXPECT_TRUE(made.is_ok()) << made.to_string();
    return path;
  }();
  return dir;
}

std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    std::string event = body.substr(pos, end - pos);
    if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

BatonRun run_baton(const std::vector<std::string>& args) {
  std::string line = std::string(BATON_BINARY);
  for (const std::string& arg : args) line += " '" + arg + "'";
  line += " 2>&1";
  BatonRun result;
  FILE* pipe = ::popen(line.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer;
  while (std::fgets(buffer.data(), int(buffer.size()), pipe) != nullptr)
    result.output += buffer.data();
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

const std::filesystem::path& windowed_tiny_model(int32_t window) {
  static std::map<int32_t, std::filesystem::path> made;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  auto it = made.find(window);
  if (it != made.end()) return it->second;
  const std::filesystem::path dir = tiny_model().string() + "-window-" + std::to_string(window);
  std::filesystem::create_directories(dir);
  for (const auto& entry : std::filesystem::directory_iterator(tiny_model()))
    std::filesystem::copy(entry.path(), dir / entry.path().filename(),
                          std::filesystem::copy_options::overwrite_existing);
  // Mistral's weights are named as Llama's; its config gives every layer
  // the window.
  json config = json::parse(std::ifstream(dir / "config.json"));
  config["architectures"] = {"MistralForCausalLM"};
  config["model_type"] = "mistral";
  config["sliding_window"] = window;
  std::ofstream(dir / "config.json") << config.dump(2);
  return made.emplace(window, dir).first->second;
}

json baton_generate(const std::string& prompt, const std::vector<std::string>& flags,
                    const std::filesystem::path& model) {
  std::string command =
      std::string(BATON_BINARY) + " generate --model " + model.string() + " --json";
  std::filesystem::path prompt_file =
      model.parent_path() / ("prompt-" + std::to_string(std::random_device{}()));
  {
    std::ofstream out(prompt_file);
    out << prompt << "\n";
  }
  command += " --prompts " + prompt_file.string();
  for (const std::string& flag : flags) command += " " + flag;
  command += " 2>/dev/null";
  std::string output;
  FILE* pipe = ::popen(command.c_str(), "r");
  std::array<char, 4096> buffer;
  while (pipe != nullptr && std::fgets(buffer.data(), int(buffer.size()), pipe) != nullptr)
    output += buffer.data();
  if (pipe != nullptr) ::pclose(pipe);
  std::filesystem::remove(prompt_file);
  size_t brace = output.find('{');
  json parsed = json::parse(
      brace == std::string::npos ? "" : output.substr(brace, output.find('\n', brace) - brace),
      nullptr, false);
  EXPECT_TRUE(parsed.is_object()) << "baton generate printed: " << output;
  return parsed;
}

json with_tie_evidence(json body) {
  body["logprobs"] = 2;
  body["return_tokens_as_token_ids"] = true;
  return body;
}

size_t same_tokens(const json& choice, const json& expected) {
  const json& tokens = choice["logprobs"]["tokens"];
  const json& ids = expected["output_ids"];
  auto id_of = [](const std::string& name) { return std::stoi(name.substr(name.find(':') + 1)); };
  size_t k = 0;
  while (k < tokens.size() && k < ids.size() &&
         id_of(tokens[k].get<std::string>()) == ids[k].get<int>())
    ++k;
  return k;
}

bool expect_greedy_equal_or_tied(const json& choice, const json& expected,
                                 const std::string& what) {
  if (choice["text"] == expected["text"]) return false;
  const json& lp = choice["logprobs"];
  const json& ids = expected["output_ids"];
  auto id_of = [](const std::string& name) { return std::stoi(name.substr(name.find(':') + 1)); };
  const size_t k = same_tokens(choice, expected);
  std::vector<std::pair<double, int>> top;  // the cluster's likeliest at token k
  if (k < lp["top_logprobs"].size()) {
    for (const auto& [name, value] : lp["top_logprobs"][k].items())
      top.emplace_back(value.get<double>(), id_of(name));
  }
  std::ranges::sort(top, std::greater<>());
  const bool tied = top.size() >= 2 && k < ids.size() && top[0].first - top[1].first < 1e-4 &&
                    (top[0].second == ids[k] || top[1].second == ids[k]);
  EXPECT_TRUE(tied) << what << ": the cluster's text " << choice["text"] << " and generate's "
                    << expected["text"] << " part at token " << k
                    << " where the two likeliest do not tie: " << lp["top_logprobs"].dump();
  if (tied)
    std::printf("%s: parted at token %zu, a tie within %.1e\n", what.c_str(), k,
                top[0].first - top[1].first);
  return true;
}

Cluster::Cluster(const ClusterShape& shape) {
  dir_ = std::filesystem::temp_directory_path() /
         ("baton-it-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir_);
  model_dir_ = shape.model.empty() ? tiny_model() : shape.model;
  heartbeat_interval_ = std::chrono::milliseconds(shape.heartbeat_interval_ms);
  http_port_ = free_port();
  zmq_port_ = free_port();
  uint16_t control_port = free_port();
  control_port_ = control_port;
  if (shape.control_keys) {
    const BatonRun made = run_baton({"keygen", (dir_ / "keys").string()});
    EXPECT_EQ(made.exit_code, 0) << made.output;
  }
  if (shape.zmq_keys) {
    const BatonRun made = run_baton({"keygen", "--clients", (dir_ / "zmq-keys").string()});
    EXPECT_EQ(made.exit_code, 0) << made.output;
  }
  config_file_ = dir_ / "cluster.yaml";
  if (!shape.ssd_cache_dir.empty()) std::filesystem::create_directories(dir_ / shape.ssd_cache_dir);
  api_key_ = shape.api_key;
  if (!api_key_.empty())
    std::ofstream(dir_ / "api_keys.txt") << "# test keys\n" << api_key_ << "\n";
  std::ofstream yaml(config_file_);
  yaml << "model: {path: " << model_dir_.string() << ", served_name: tiny}\n"
       << "router:\n  host: 127.0.0.1\n  http_port: " << http_port_ << "\n  zmq_port: " << zmq_port_
       << "\n  control_port: " << control_port << "\n  policy: " << shape.policy
       << "\n  min_remote_prefill_tokens: " << shape.min_remote_prefill_tokens
       << "\n  heartbeat_interval_ms: " << shape.heartbeat_interval_ms
       << "\n  heartbeat_timeout_ms: " << shape.heartbeat_timeout_ms
       << "\n  drain_timeout_ms: 8000\n"
       << (shape.api_key.empty() ? "" : "  api_key_file: api_keys.txt\n")
       << (shape.control_keys ? "  control_keys: keys\n" : "")
       << (shape.zmq_keys ? "  zmq_keys: zmq-keys\n" : "") << shape.extra_router_yaml
       << "engine: {threads: 1, kv_cache_bytes: " << shape.kv_cache_bytes
       << ", max_num_seqs: " << shape.max_num_seqs
       << ", max_num_batched_tokens: " << shape.max_num_batched_tokens
       << ", max_model_len: " << shape.max_model_len
       << (shape.kv_dtype.empty() ? "" : ", kv_dtype: " + shape.kv_dtype)
       << (shape.ssd_cache_dir.empty() ? "" : ", ssd_cache_dir: " + shape.ssd_cache_dir) << "}\n"
       << "transfer: {default_deadline_ms: 3000, share_pool: "
       << (shape.share_pool ? "true" : "false")
       << (shape.staging_blocks > 0 ? ", staging_blocks: " + std::to_string(shape.staging_blocks)
                                    : std::string())
       << "}\n";
  yaml << "prefill:\n";
  for (int i = 0; i < shape.prefill_nodes; ++i)
    yaml << "  - {name: prefill-" << i << ", engine: {nice: " << shape.prefill_nice << "}"
         << (shape.prefill_staging_blocks > 0
                 ? ", transfer: {staging_blocks: " + std::to_string(shape.prefill_staging_blocks) +
                       "}"
                 : std::string())
         << "}\n";
  yaml << "decode:\n";
  for (int i = 0; i < shape.decode_nodes; ++i) {
    yaml << "  - {name: decode-" << i
         << ", engine: {min_step_interval_ms: " << shape.decode_min_step_interval_ms << "}}\n";
  }
  yaml.close();

  if (shape.separate_roles) {
    // Each role as its own process, as on several hosts.
    start_router();
    for (int i = 0; shape.start_nodes && i < shape.prefill_nodes; ++i)
      start_node("prefill", "prefill-" + std::to_string(i));
    for (int i = 0; shape.start_nodes && i < shape.decode_nodes; ++i)
      start_node("decode", "decode-" + std::to_string(i));
  } else {
    Status spawned = group_.spawn(
        "up", {BATON_BINARY, "--log-level", "warn", "up", config_file_.string(), "--ready-timeout",
               "60", "--max-restarts", std::to_string(shape.max_restarts)});
    EXPECT_TRUE(spawned.is_ok()) << spawned.to_string();
  }
  if (!shape.wait_until_up) return;
  auto deadline = std::chrono::steady_clock::now() + 60s;
  size_t want = size_t(shape.prefill_nodes + shape.decode_nodes);
  while (std::chrono::steady_clock::now() < deadline) {
    json doc = nodes();
    size_t up = 0;
    if (doc.contains("nodes")) {
      for (const auto& node : doc["nodes"]) up += node.value("up", false);
    }
    if (up == want) return;
    bool up_exited = false;
    for (const auto& exit : group_.reap()) {
      ADD_FAILURE() << exit.name << " " << tools::describe_exit(exit.status);
      up_exited |= exit.name == "up";
    }
    if (up_exited) return;  // nothing will come up
    std::this_thread::sleep_for(50ms);
  }
  ADD_FAILURE() << "the cluster did not come up within 60 s";
}

Cluster::~Cluster() {
  group_.stop({"up"}, 20s);
  group_.stop(group_.names(), 10s);  // nodes the test started itself
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

bool Cluster::up_running() {
  (void)group_.reap();  // marks the children that exited
  return group_.running("up");
}

void Cluster::start_router() {
  Status spawned = group_.spawn(
      "router", {BATON_BINARY, "--log-level", "warn", "router", "--config", config_file_.string()});
  EXPECT_TRUE(spawned.is_ok()) << spawned.to_string();
}

void Cluster::kill_process(const std::string& name) {
  group_.stop({name}, 0ms);  // SIGTERM then at once SIGKILL, and reaped
}

void Cluster::start_node(const std::string& role, const std::string& name) {
  Status spawned = group_.spawn(name, {BATON_BINARY, "--log-level", "warn", role, "--config",
                                       config_file_.string(), "--name", name});
  EXPECT_TRUE(spawned.is_ok()) << spawned.to_string();
}

int64_t Cluster::generated_tokens(const std::string& role) const {
  std::this_thread::sleep_for(3 * heartbeat_interval_);
  int64_t total = 0;
  for (const auto& node : nodes().value("nodes", json::array())) {
    if (node.value("role", "") == role) total += node.value("generation_tokens", int64_t(0));
  }
  return total;
}

double Cluster::metric(const std::string& name, const std::string& label) const {
  auto response = get("/metrics");
  if (!response.is_ok() || response->status != 200) return -1;
  std::istringstream lines(response->body);
  double total = 0;
  bool found = false;
  for (std::string line; std::getline(lines, line);) {
    const bool named = line.rfind(name + "{", 0) == 0 || line.rfind(name + " ", 0) == 0;
    if (named && line.find(label) != std::string::npos) {
      total += std::stod(line.substr(line.rfind(' ') + 1));
      found = true;
    }
  }
  return found ? total : -1;
}

bool Cluster::node_up(const std::string& name) const {
  for (const auto& node : nodes().value("nodes", json::array())) {
    if (node.value("name", "") == name) return node.value("up", false);
  }
  return false;
}

int Cluster::terminate(std::chrono::milliseconds grace) {
  group_.signal("up", SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline) {
    for (const auto& exit : group_.reap()) return exit.status;
    std::this_thread::sleep_for(20ms);
  }
  group_.stop({"up"}, 0ms);
  return -1;
}

Result<tools::HttpResponse> Cluster::get(const std::string& target) const {
  return tools::http_request("127.0.0.1", http_port_, "GET", target, {}, 30s, api_key_);
}

Result<tools::HttpResponse> Cluster::post(const std::string& target, const json& body) const {
  return post_raw(target, body.dump());
}

Result<tools::HttpResponse> Cluster::post_raw(const std::string& target,
                                              const std::string& body) const {
  return tools::http_request("127.0.0.1", http_port_, "POST", target, body, 60s, api_key_);
}

Result<std::vector<std::string>> Cluster::post_stream(const std::string& target,
                                                      const json& body) const {
  BATON_ASSIGN_OR_RETURN(tools::HttpResponse response, post(target, body));
  if (response.status != 200)
    return internal_error("status " + std::to_string(response.status) + ": " + response.body);
  return sse_payloads(response.body);
}

json Cluster::nodes() const {
  auto response = get("/v1/nodes");
  if (!response.is_ok() || response->status != 200) return json::object();
  return json::parse(response->body, nullptr, false);
}

pid_t Cluster::node_pid(const std::string& name) const {
  json doc = nodes();
  for (const auto& node : doc.value("nodes", json::array())) {
    if (node.value("name", "") == name) return pid_t(node.value("pid", 0));
  }
  return 0;
}

bool Cluster::wait_drained(std::chrono::milliseconds timeout) const {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    json doc = nodes();
    bool drained = doc.contains("nodes") && doc.value("requests_in_router", 1) == 0;
    for (const auto& node : doc.value("nodes", json::array())) {
      if (!node.value("up", false)) continue;
      // Staged pools: every transfer gave its host slots back too.
      drained = drained && node.value("free_blocks", -1) == node.value("total_blocks", -2) &&
                node.value("running", 1) == 0 && node.value("waiting", 1) == 0 &&
                node.value("awaiting_kv", 1) == 0 && node.value("requests", 1) == 0 &&
                node.value("staging_slots_free", -1) == node.value("staging_slots", -2);
    }
    if (drained) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

}  // namespace baton::testing

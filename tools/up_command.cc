// tools/up_command.cc — `baton up CONFIG`: every role of the config that
// belongs to this host, as its own process; ready when the router reports
// every local node up; a role that exits on its own is started again;
// Ctrl-C / SIGTERM drains the router, then stops nodes.
#include <ifaddrs.h>
#include <netdb.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "cluster/cluster_config.h"
#include "engine/forward_backend.h"
#include "engine/make_model.h"
#include "engine/model_config.h"
#include "router/api_keys.h"
#include "tools/commands.h"
#include "tools/http_client.h"
#include "tools/process_group.h"
#include "tools/restart_policy.h"
#include "tools/stop_signal.h"

namespace baton::tools {
namespace {

using namespace std::chrono_literals;

struct UpOptions {
  std::string config;
  int ready_timeout_s = 300;
  int max_restarts = 5;
};

// Whether `host` names this machine: loopback, a wildcard, the host name, or
// one of its interface addresses.
bool is_local_host(const std::string& host) {
  static const std::set<std::string> kAlways = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "::"};
  if (kAlways.contains(host)) return true;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) == 0 && host == name) return true;
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return false;
  bool local = false;
  for (ifaddrs* it = interfaces; it != nullptr && !local; it = it->ifa_next) {
    if (it->ifa_addr == nullptr) continue;
    int family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char address[NI_MAXHOST];
    socklen_t length = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::getnameinfo(it->ifa_addr, length, address, sizeof(address), nullptr, 0, NI_NUMERICHOST) ==
        0) {
      local = host == address;
    }
  }
  ::freeifaddrs(interfaces);
  return local;
}

Status ensure_model(const cluster::ClusterConfig& config) {
  const cluster::ModelSection& model = config.model;
  if (std::filesystem::exists(model.path / "config.json")) return Status::ok();
  if (model.preset.empty())
    return not_found(model.path.string() +
                     "/config.json: no checkpoint there and no preset to make one");
  std::printf("making model %s (%s) in %s ...\n", model.preset.c_str(),
              std::string(dtype_name(model.dtype)).c_str(), model.path.c_str());
  std::fflush(stdout);
  BATON_ASSIGN_OR_RETURN(engine::ModelConfig shape, engine::model_preset(model.preset));
  engine::MakeModelOptions options;
  options.seed = model.seed;
  options.dtype = model.dtype;
  return engine::make_random_checkpoint(shape, model.path, options);
}

std::string self_executable() {
  std::error_code ec;
  auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "baton" : path.string();
}

// What the router's /v1/nodes says of the local nodes: the pid each last
// registered with (none: never registered) and which are up as the process
// this `baton up` started (a router of another cluster on the same port
// lists nodes of the same names). Empty when the router does not answer
// within `timeout`.
struct LocalNodesView {
  std::map<std::string, pid_t> listed;
  std::set<std::string> up;
};
std::optional<LocalNodesView> view_local_nodes(const std::string& host, uint16_t port,
                                               const std::set<std::string>& local_nodes,
                                               const std::string& api_key,
                                               const ProcessGroup& group,
                                               std::chrono::milliseconds timeout = 2s) {
  Result<HttpResponse> nodes = http_request(host, port, "GET", "/v1/nodes", {}, timeout, api_key);
  if (!nodes.is_ok() || nodes->status != 200) return std::nullopt;
  nlohmann::json doc = nlohmann::json::parse(nodes->body, nullptr, false);
  if (!doc.is_object() || !doc.contains("nodes") || !doc["nodes"].is_array()) return std::nullopt;
  LocalNodesView view;
  for (const auto& node : doc["nodes"]) {
    if (!node.is_object()) continue;
    const std::string name = node.value("name", "");
    if (!local_nodes.contains(name)) continue;
    // The router lists every configured node from its start; one that never
    // registered has no pid yet.
    const pid_t pid = node.value("pid", pid_t(0));
    if (pid == 0) continue;
    view.listed[name] = pid;
    if (node.value("up", false) && pid == group.pid(name)) view.up.insert(name);
  }
  return view;
}

int fail(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.message().c_str());
  return 1;
}

int run_up(const UpOptions& options) {
  const std::atomic<bool>& stop = install_stop_signals();
  Result<cluster::ClusterConfig> loaded = cluster::load_cluster_config(options.config);
  if (!loaded.is_ok()) return fail(loaded.status());
  const cluster::ClusterConfig& config = *loaded;
  // A node on a device this host lacks would only exit and be restarted (and
  // a preset is not made for nothing).
  for (const auto* nodes : {&config.prefill, &config.decode}) {
    for (const cluster::NodeSection& node : *nodes) {
      if (!is_local_host(node.host)) continue;
      if (Status s = engine::check_device_present(node.engine.device); !s.is_ok()) {
        return fail(s.with_context(std::string(cluster::role_name(node.role)) + " node '" +
                                   node.name + "'"));
      }
    }
  }
  // The nodes started here share this host's memory, whichever of its names
  // or addresses each one's host is.
  if (Status shares = cluster::check_memory_fractions(
          config, [](const std::string& host) { return is_local_host(host) ? "this host" : ""; });
      !shares.is_ok())
    return fail(shares);
  if (Status made = ensure_model(config); !made.is_ok()) return fail(made);
  Result<engine::ModelConfig> model = engine::load_model_config(config.model.path / "config.json");
  if (!model.is_ok()) return fail(model.status());
  if (Status fits = cluster::validate_against_model(config, *model); !fits.is_ok())
    return fail(fits);
  // The router's own key, for its /v1/nodes.
  Result<router::ApiKeys> keys = router::ApiKeys::load(config.router.api_key_file);
  if (!keys.is_ok()) return fail(keys.status());
  const std::string api_key = keys->first();

  std::string exe = self_executable();
  std::string config_path = config.file.string();
  std::string log_level(spdlog::level::to_string_view(spdlog::get_level()).data());
  ProcessGroup group;
  bool local_router = is_local_host(config.router.host);
  std::set<std::string> local_nodes;
  // Each role's command line, and since when its run has been seen healthy
  // (a node up in the router as this process, the router answering): a
  // role that exits on its own is started again (restart_policy.h).
  std::map<std::string, std::vector<std::string>> commands;
  std::map<std::string, std::optional<std::chrono::steady_clock::time_point>> healthy_since;
  auto start_role = [&](const std::string& name) {
    healthy_since[name].reset();
    return group.spawn(name, commands[name]);
  };
  // The router counts as healthy once it lists one of this host's nodes up
  // as the process started here (another cluster's router on the same port
  // answers too), or answers at all where no node runs here.
  auto note_healthy = [&](const std::optional<LocalNodesView>& view) {
    if (!view) return;
    const auto now = std::chrono::steady_clock::now();
    if (local_router && !healthy_since["router"] && (local_nodes.empty() || !view->up.empty()))
      healthy_since["router"] = now;
    for (const std::string& name : view->up)
      if (!healthy_since[name]) healthy_since[name] = now;
  };
  // Whether a role running now has not been seen healthy yet.
  auto unproven = [&] {
    return std::ranges::any_of(group.names(), [&](const std::string& name) {
      return group.running(name) && !healthy_since[name];
    });
  };
  if (local_router) {
    commands["router"] = {exe, "--log-level", log_level, "router", "--config", config_path};
    if (Status s = start_role("router"); !s.is_ok()) return fail(s);
  }
  for (const auto* nodes : {&config.prefill, &config.decode}) {
    for (const cluster::NodeSection& node : *nodes) {
      if (!is_local_host(node.host)) continue;
      std::string role(cluster::role_name(node.role));
      commands[node.name] = {exe,        "--log-level", log_level, role,
                             "--config", config_path,   "--name",  node.name};
      if (Status s = start_role(node.name); !s.is_ok()) return fail(s);
      local_nodes.insert(node.name);
    }
  }
  if (group.names().empty())
    return fail(invalid_argument("no role of " + config_path + " runs on this host"));

  std::string router_host = config.router.host == "0.0.0.0" ? "127.0.0.1" : config.router.host;
  uint16_t port = config.router.http_port;

  auto stop_all = [&] {
    if (local_router) group.stop({"router"}, config.router.drain_timeout + 5s);
    std::vector<std::string> nodes(local_nodes.begin(), local_nodes.end());
    group.stop(nodes, 10s);
  };

  // A role that exited on its own is started again after a delay; one that
  // keeps exiting is given up: a node is then routed around, the router's
  // loss stops the cluster. Returns false when the cluster must stop.
  RestartPolicy restarts({.max_restarts = options.max_restarts});
  std::map<std::string, std::chrono::steady_clock::time_point> pending;
  auto on_role_exit = [&](const ProcessGroup::Exit& exit) {
    const auto now = std::chrono::steady_clock::now();
    const std::string what = (exit.name == "router" ? "the router " : "node " + exit.name + " ") +
                             describe_exit(exit.status);
    if (auto delay = restarts.on_exit(exit.name, healthy_since[exit.name], now)) {
      std::fprintf(stderr, "warning: %s; starting it again in %.1f s (restart %d of %d in a row)\n",
                   what.c_str(), double(delay->count()) / 1000.0, restarts.restarts(exit.name),
                   restarts.max_restarts());
      pending[exit.name] = now + *delay;
      return true;
    }
    if (exit.name == "router") {
      std::fprintf(stderr, "error: %s%s; stopping the cluster\n", what.c_str(),
                   restarts.max_restarts() > 0 ? " again, after its last restart" : "");
      return false;
    }
    std::fprintf(stderr, "warning: %s%s; the router routes around it\n", what.c_str(),
                 restarts.max_restarts() > 0 ? " again, after its last restart" : "");
    return true;
  };
  // Returns false when the cluster must stop. A start that fails (fork
  // refused for want of memory or processes) counts as a run that exited
  // at once: tried again after the next delay, up to the same limit.
  auto start_due_roles = [&] {
    const auto now = std::chrono::steady_clock::now();
    bool go_on = true;
    for (auto it = pending.begin(); it != pending.end();) {
      if (it->second > now) {
        ++it;
        continue;
      }
      const std::string name = it->first;
      it = pending.erase(it);
      if (Status s = start_role(name); !s.is_ok()) {
        std::fprintf(stderr, "warning: cannot start %s again: %s\n", name.c_str(),
                     s.message().c_str());
        go_on = on_role_exit({name, 127 << 8}) && go_on;  // as a child that could not exec
      } else {
        std::fprintf(stderr, "started %s again\n", name.c_str());
      }
    }
    return go_on;
  };

  // Start-up lasts until every local node still running is up in the
  // router. A node that exits before the router has registered it fails
  // the start-up (a bad config, a crash on loading): everything stops. One
  // that exits after registering has failed at run time, as it may at any
  // later moment, whoever has seen the cluster ready by then: it is started
  // again, and the rest of the cluster keeps running.
  std::set<std::string> lost;
  const auto start_time = std::chrono::steady_clock::now();
  auto ready_deadline = start_time + std::chrono::seconds(options.ready_timeout_s);
  // A start-up that takes long says what it waits for: a router that does
  // not answer (on another host, perhaps not started), or the nodes not up.
  auto next_report = start_time + 5s;
  const std::string router_url = "http://" + router_host + ":" + std::to_string(port);
  auto waiting_for = [&](const std::optional<LocalNodesView>& view) {
    if (!view) {
      return "the router at " + router_url + (local_router ? "" : " (not on this host)") +
             " does not answer";
    }
    std::string nodes;
    for (const std::string& name : local_nodes) {
      if (view->up.contains(name)) continue;
      nodes += (nodes.empty() ? "not up yet: " : ", ") + name +
               (view->listed.contains(name) ? "" : " (not registered)");
    }
    return nodes;
  };
  auto report_wait = [&](const std::optional<LocalNodesView>& view) {
    const auto now = std::chrono::steady_clock::now();
    if (now < next_report) return;
    next_report = now + 30s;
    const auto waited = std::chrono::duration_cast<std::chrono::seconds>(now - start_time);
    std::fprintf(stderr, "waiting for the cluster (%llds of %ds): %s\n",
                 static_cast<long long>(waited.count()), options.ready_timeout_s,
                 waiting_for(view).c_str());
  };
  while (true) {
    for (const auto& exit : group.reap()) {
      // Asked after the exit: a node registered before it died is listed.
      std::optional<LocalNodesView> view =
          exit.name == "router" ? std::nullopt
                                : view_local_nodes(router_host, port, local_nodes, api_key, group);
      // Registered as this very process: its pid, not an earlier run's. A
      // node lost before and started again follows the restart policy.
      const bool registered = view && [&] {
        const auto listed = view->listed.find(exit.name);
        return listed != view->listed.end() && listed->second == exit.pid;
      }();
      if (registered || lost.contains(exit.name)) {
        lost.insert(exit.name);
        if (on_role_exit(exit)) continue;
      }
      stop_all();
      return fail(unavailable(exit.name + " " + describe_exit(exit.status) + " during start-up"));
    }
    if (!start_due_roles()) {
      stop_all();
      return fail(unavailable("a role could not be started again during start-up"));
    }
    std::optional<LocalNodesView> view =
        view_local_nodes(router_host, port, local_nodes, api_key, group);
    note_healthy(view);
    if (view && std::ranges::all_of(local_nodes, [&](const std::string& name) {
          return lost.contains(name) || view->up.contains(name);
        }))
      break;
    report_wait(view);
    if (stop.load()) {
      stop_all();
      return 0;
    }
    if (std::chrono::steady_clock::now() > ready_deadline) {
      stop_all();
      return fail(deadline_exceeded("the cluster was not ready after " +
                                    std::to_string(options.ready_timeout_s) +
                                    " s: " + waiting_for(view)));
    }
    std::this_thread::sleep_for(100ms);
  }
  const std::string& url = router_url;
  // What this host runs; the file's other nodes run elsewhere.
  auto started_here = [&](const std::vector<cluster::NodeSection>& nodes) {
    return std::ranges::count_if(
        nodes, [&](const cluster::NodeSection& node) { return local_nodes.contains(node.name); });
  };
  const auto prefill_here = size_t(started_here(config.prefill));
  const auto decode_here = size_t(started_here(config.decode));
  const size_t elsewhere = config.prefill.size() + config.decode.size() - local_nodes.size();
  std::printf("Baton is up: %s  (%zu processes: %s%zu prefill, %zu decode%s)\n", url.c_str(),
              group.names().size(), local_router ? "router, " : "", prefill_here, decode_here,
              elsewhere == 0 ? ""
                             : ("; " + std::to_string(elsewhere) + " more node" +
                                (elsewhere == 1 ? "" : "s") + " on other hosts")
                                   .c_str());
  std::printf(
      "Try:\n  curl %s/v1/completions -H 'Content-Type: application/json' \\\n%s"
      "    -d '{\"model\": \"%s\", \"prompt\": \"The capital of France is\", \"max_tokens\": "
      "16}'\n",
      url.c_str(), api_key.empty() ? "" : "    -H \"Authorization: Bearer $BATON_API_KEY\" \\\n",
      config.model.served_name.c_str());
  std::printf("Ctrl-C stops the cluster.\n");
  std::fflush(stdout);

  int code = 0;
  auto next_look = std::chrono::steady_clock::now();
  while (!stop.load() && code == 0) {
    for (const auto& exit : group.reap())
      if (!on_role_exit(exit)) code = 1;
    if (code == 0 && !start_due_roles()) code = 1;
    // Roles started again are healthy once seen so: a short look a second
    // while one is not yet (and none once all are, so a settled cluster
    // sees no requests of its supervisor).
    if (std::chrono::steady_clock::now() >= next_look && unproven()) {
      next_look = std::chrono::steady_clock::now() + 1s;
      note_healthy(view_local_nodes(router_host, port, local_nodes, api_key, group, 300ms));
    }
    std::this_thread::sleep_for(100ms);
  }
  std::printf("stopping: draining the router (up to %lld ms), then the nodes\n",
              static_cast<long long>(config.router.drain_timeout.count()));
  std::fflush(stdout);
  stop_all();
  return code;
}

}  // namespace

std::function<int()> add_up_command(CLI::App& app) {
  auto* sub =
      app.add_subcommand("up", "Start every role of a cluster config that runs on this host");
  auto options = std::make_shared<UpOptions>();
  sub->add_option("config", options->config, "Cluster YAML (configs/local.yaml)")->required();
  sub->add_option("--ready-timeout", options->ready_timeout_s,
                  "Seconds to wait for every node to register")
      ->capture_default_str();
  sub->add_option("--max-restarts", options->max_restarts,
                  "Times in a row a role that exits on its own is started again (after 1, 2, "
                  "4 ... up to 30 s; a minute up and healthy starts the count over); 0: never")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  return [options] { return run_up(*options); };
}

}  // namespace baton::tools

// tools/keygen_command.cc — `baton keygen DIR [--clients]`: fresh CURVE keys
// (common/curve_keys.h) for a cluster's control plane (router.control_keys)
// or for its ZeroMQ client front end (router.zmq_keys).
#include <cstdio>
#include <string>

#include "common/curve_keys.h"
#include "tools/commands.h"

namespace baton::tools {

std::function<int()> add_keygen_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "keygen",
      "write CURVE keys for the control plane (router.control_keys) or, with --clients, for "
      "the ZeroMQ client front end (router.zmq_keys)");
  auto dir = std::make_shared<std::string>();
  auto clients = std::make_shared<bool>(false);
  cmd->add_option("dir", *dir, "directory to write the keys into (never overwritten)")->required();
  cmd->add_flag("--clients", *clients,
                "keys of the ZeroMQ client front end: router.pub/.key and client.pub/.key");
  return [dir, clients] {
    const control::KeyRing ring =
        *clients ? control::KeyRing::kClients : control::KeyRing::kControl;
    if (Status s = control::write_curve_keys(*dir, ring); !s.is_ok()) {
      std::fprintf(stderr, "error: %s\n", s.message().c_str());
      return 1;
    }
    if (*clients) {
      std::printf(
          "wrote router.pub, router.key, client.pub and client.key to %s\n"
          "Name it in the cluster YAML (router: {zmq_keys: %s}); ZeroMQ clients need "
          "router.pub and the client pair (baton bench --zmq-keys %s); the .key files are "
          "secret.\n",
          dir->c_str(), dir->c_str(), dir->c_str());
    } else {
      std::printf(
          "wrote router.pub, router.key, node.pub and node.key to %s\n"
          "Name it in the cluster YAML (router: {control_keys: %s}) and copy it to every host "
          "of the cluster; the .key files are secret.\n",
          dir->c_str(), dir->c_str());
    }
    return 0;
  };
}

}  // namespace baton::tools

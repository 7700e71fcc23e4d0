// tools/keygen_command.cc — `baton keygen DIR`: fresh CURVE keys for a
// cluster's control plane (common/control_keys.h), for router.control_keys.
#include <cstdio>
#include <string>

#include "common/control_keys.h"
#include "tools/commands.h"

namespace baton::tools {

std::function<int()> add_keygen_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "keygen",
      "write CURVE keys for the control plane (name the directory as router.control_keys)");
  auto dir = std::make_shared<std::string>();
  cmd->add_option("dir", *dir, "directory to write router.pub/.key and node.pub/.key into")
      ->required();
  return [dir] {
    if (Status s = control::write_control_keys(*dir); !s.is_ok()) {
      std::fprintf(stderr, "error: %s\n", s.message().c_str());
      return 1;
    }
    std::printf(
        "wrote router.pub, router.key, node.pub and node.key to %s\n"
        "Name it in the cluster YAML (router: {control_keys: %s}) and copy it to every host "
        "of the cluster; the .key files are secret.\n",
        dir->c_str(), dir->c_str());
    return 0;
  };
}

}  // namespace baton::tools

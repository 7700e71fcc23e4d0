// tools/commands.h — the subcommands of the `baton` binary. Each registers
// its options on the CLI11 app and returns the process exit code when run.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

#include "cluster/cluster_config.h"

namespace baton::tools {

// Returns the function that runs the subcommand after parsing.
std::function<int()> add_make_model_command(CLI::App& app);
std::function<int()> add_generate_command(CLI::App& app);
std::function<int()> add_router_command(CLI::App& app);
std::function<int()> add_node_command(CLI::App& app, cluster::Role role);  // prefill or decode
std::function<int()> add_up_command(CLI::App& app);
std::function<int()> add_bench_command(CLI::App& app);
std::function<int()> add_keygen_command(CLI::App& app);

}  // namespace baton::tools

// tools/baton_main.cc — the `baton` command-line entry.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <functional>
#include <map>
#include <string>

#include "common/logging.h"
#include "kernels/cpu/blas_setup.h"
#include "kernels/cpu/cpu_features.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  // Before any thread starts: it may set and unset an environment variable
  // for OpenBLAS to read, which getenv on another thread must not race.
  baton::kernels::cpu::setup_blas();
  if (const std::string error = baton::kernels::cpu::max_cpu_isa_error(); !error.empty()) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return 2;
  }
  CLI::App app{"Baton: disaggregated prefill/decode serving for Llama-family models"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();

  std::map<std::string, std::function<int()>> runners;
  runners["make-model"] = baton::tools::add_make_model_command(app);
  runners["generate"] = baton::tools::add_generate_command(app);
  runners["up"] = baton::tools::add_up_command(app);
  runners["router"] = baton::tools::add_router_command(app);
  runners["prefill"] = baton::tools::add_node_command(app, baton::cluster::Role::kPrefill);
  runners["decode"] = baton::tools::add_node_command(app, baton::cluster::Role::kDecode);
  runners["bench"] = baton::tools::add_bench_command(app);
  runners["keygen"] = baton::tools::add_keygen_command(app);

  CLI11_PARSE(app, argc, argv);
  baton::init_logging("baton");
  if (auto status = baton::set_log_level(log_level); !status.is_ok()) {
    std::fprintf(stderr, "error: --log-level: %s\n", status.message().c_str());
    return 2;
  }
  for (auto* sub : app.get_subcommands()) return runners.at(sub->get_name())();
  return 2;
}

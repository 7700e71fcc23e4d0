// tools/bench_command.cc — `baton bench`: load-tests a router the way
// `vllm bench serve` does (same options where they exist, same table and
// JSON keys); `baton bench sweep` runs it at several request rates and draws
// the chart; `baton bench merge` joins the results of shards run on several
// hosts. The work is in tools/loadtest/.
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>

#include "tools/commands.h"
#include "tools/loadtest/bench_runner.h"
#include "tools/loadtest/bench_session.h"
#include "tools/loadtest/positive_number.h"
#include "tools/loadtest/result_json.h"
#include "tools/loadtest/sweep.h"
#include "tools/open_file_limit.h"

namespace baton::tools {
namespace {

using json = nlohmann::json;
using loadtest::BenchResult;
using loadtest::BenchSession;

constexpr uint16_t kDefaultHttpPort = 8000, kDefaultZmqPort = 8001;

struct BenchCli {
  loadtest::BenchOptions run;
  std::string backend = "http";
  int port = 0;          // 0: the backend's default
  std::string zmq_keys;  // a `baton keygen --clients` directory
  std::string request_rate = "inf";
  double timeout_s = 600;
  std::vector<std::string> goodput;
  std::string percentile_metrics = "ttft,tpot,itl";
  std::string metric_percentiles = "99";
  // vLLM's --save-result is a switch with --result-dir and --result-filename;
  // Baton's own form, --save-result FILE, names the file at once.
  std::optional<std::string> save_result;
  std::string result_dir;
  std::string result_filename;
  bool save_detailed = false;
  std::string base_url;
  std::vector<std::string> metadata;  // KEY=VALUE, into the saved result
  std::string run_label;              // the saved file's name prefix (vLLM's --label)
  bool ignore_eos = false;
  std::vector<std::string> unsupported;  // vLLM flags given that Baton does not take
  // sweep
  std::string rates;
  std::string label = "baton";
  std::string svg = "sweep.svg";
  std::string title = "Baton: latency and goodput against request rate";
  std::vector<std::string> compare;
  // merge
  std::vector<std::string> merge_files;
};

// The sections of the latency table (--percentile-metrics).
using Metrics = std::vector<std::string>;

int fail(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.message().c_str());
  return 1;
}

// vllm bench serve's flags that Baton does not take: refused by name rather
// than with CLI11's generic complaint.
constexpr const char* kUnsupportedVllmFlags[] = {"--tokenizer",
                                                 "--tokenizer-mode",
                                                 "--trust-remote-code",
                                                 "--use-beam-search",
                                                 "--logprobs",
                                                 "--profile",
                                                 "--disable-tqdm",
                                                 "--top-p",
                                                 "--top-k",
                                                 "--min-p",
                                                 "--served-model-name",
                                                 "--lora-modules",
                                                 "--ramp-up-strategy",
                                                 "--ramp-up-start-rps",
                                                 "--ramp-up-end-rps",
                                                 "--ready-check-timeout-sec",
                                                 "--append-result",
                                                 "--request-id-prefix",
                                                 "--num-warmups",
                                                 "--disable-shuffle",
                                                 "--hf-subset",
                                                 "--hf-split",
                                                 "--hf-output-len",
                                                 "--sonnet-input-len",
                                                 "--sonnet-output-len",
                                                 "--sonnet-prefix-len",
                                                 "--custom-output-len",
                                                 "--custom-skip-chat-template"};

// --base-url http://host[:port][/]
Status apply_base_url(BenchCli& cli) {
  constexpr std::string_view kScheme = "http://";
  std::string_view url = cli.base_url;
  if (!url.starts_with(kScheme)) {
    return invalid_argument(
        "--base-url must be http://host[:port] (Baton serves plain HTTP), got " + cli.base_url);
  }
  url.remove_prefix(kScheme.size());
  if (!url.empty() && url.back() == '/') url.remove_suffix(1);
  if (url.find('/') != std::string_view::npos) {
    return invalid_argument("--base-url takes no path (the routes are under /v1), got " +
                            cli.base_url);
  }
  const size_t colon = url.rfind(':');
  cli.run.address.host = std::string(url.substr(0, colon));
  int port = 80;
  if (colon != std::string_view::npos) {
    const auto text = std::string(url.substr(colon + 1));
    char* end = nullptr;
    port = int(std::strtol(text.c_str(), &end, 10));
    if (text.empty() || *end != '\0' || port < 1 || port > 65535) {
      return invalid_argument("--base-url: bad port in " + cli.base_url);
    }
  }
  if (cli.run.address.host.empty())
    return invalid_argument("--base-url: no host in " + cli.base_url);
  cli.port = port;
  cli.backend = "http";
  return Status::ok();
}

// The file --save-result writes: Baton's FILE, or vLLM's
// [DIR/]{label|backend}-{rate}qps[-concurrency{N}]-{model}-{time}.json, of
// the run saved: its rate ("infqps", "4qps"; "sweep" for a sweep's) and limit.
std::string result_path(const BenchCli& cli, const std::string& model, const std::string& rate,
                        int64_t max_concurrency) {
  if (!cli.save_result) return "";
  std::string name = !cli.save_result->empty() ? *cli.save_result : cli.result_filename;
  if (name.empty()) {
    char stamp[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
    std::string base_model = model.substr(model.find_last_of('/') + 1);
    name =
        (cli.run_label.empty() ? std::string("baton") : cli.run_label) + "-" + rate +
        (max_concurrency > 0 ? "-concurrency" + std::to_string(max_concurrency) : std::string()) +
        "-" + base_model + "-" + stamp + ".json";
  }
  if (!cli.result_dir.empty()) return (std::filesystem::path(cli.result_dir) / name).string();
  return name;
}

// The parts of the options CLI11 cannot check by itself.
Status resolve(BenchCli& cli) {
  if (!cli.unsupported.empty()) {
    return invalid_argument(cli.unsupported.front() +
                            " is a vllm bench serve flag Baton does not take (docs: baton bench "
                            "--help lists what it does)");
  }
  if (!cli.base_url.empty()) BATON_RETURN_IF_ERROR(apply_base_url(cli));
  // vLLM's backends all speak HTTP; openai-chat means the chat endpoint.
  if (cli.backend == "vllm" || cli.backend == "openai") cli.backend = "http";
  if (cli.backend == "openai-chat") {
    cli.backend = "http";
    cli.run.endpoint = "/v1/chat/completions";
  }
  for (const std::string& pair : cli.metadata) {
    if (pair.find('=') == std::string::npos || pair.front() == '=') {
      return invalid_argument("--metadata takes KEY=VALUE pairs, got " + pair);
    }
  }
  BATON_ASSIGN_OR_RETURN(cli.run.address.backend, loadtest::parse_backend(cli.backend));
  if (cli.port < 0 || cli.port > 65535) return invalid_argument("--port must be 1..65535");
  cli.run.address.port = cli.port > 0                                          ? uint16_t(cli.port)
                         : cli.run.address.backend == loadtest::Backend::kHttp ? kDefaultHttpPort
                                                                               : kDefaultZmqPort;
  if (!cli.zmq_keys.empty()) {
    if (cli.run.address.backend != loadtest::Backend::kZmq)
      return invalid_argument("--zmq-keys is for --backend zmq");
    auto keys = control::read_client_keys(cli.zmq_keys, control::KeyRing::kClients);
    if (!keys.is_ok()) return keys.status().with_context("--zmq-keys");
    cli.run.address.zmq_keys = std::move(keys).value();
  }
  if (!(cli.timeout_s > 0)) return invalid_argument("--request-timeout must be positive");
  cli.run.address.timeout = std::chrono::milliseconds(int64_t(cli.timeout_s * 1e3));
  if (cli.run.address.api_key.empty()) {
    if (const char* key = std::getenv("OPENAI_API_KEY"); key != nullptr)
      cli.run.address.api_key = key;
  }
  std::optional<double> rate =
      loadtest::parse_positive_number(cli.request_rate, /*allow_inf=*/true);
  if (!rate) return invalid_argument("--request-rate must be a positive number or inf");
  cli.run.request_rate = *rate;
  BATON_ASSIGN_OR_RETURN(cli.run.slo, loadtest::parse_goodput(cli.goodput));
  BATON_ASSIGN_OR_RETURN(cli.run.metric_percentiles,
                         loadtest::parse_metric_percentiles(cli.metric_percentiles));
  cli.run.progress = ::isatty(STDERR_FILENO) == 1;
  return Status::ok();
}

Status save(const std::string& path, json doc, const std::vector<std::string>& metadata = {}) {
  if (path.empty()) return Status::ok();
  // vLLM writes --metadata KEY=VALUE pairs at the top of the result.
  for (const std::string& pair : metadata) {
    const size_t eq = pair.find('=');
    doc[pair.substr(0, eq)] = pair.substr(eq + 1);
  }
  const auto dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  BATON_RETURN_IF_ERROR(loadtest::write_json_file(path, doc));
  std::printf("Saved %s\n", path.c_str());
  return Status::ok();
}

void print_start(const BenchSession& session, double rate, const BenchCli& cli) {
  const auto& c = session.config();
  std::printf("Benchmarking %s at %s:%u%s (%s), model %s\n", c.backend.c_str(),
              cli.run.address.host.c_str(), unsigned(cli.run.address.port), c.endpoint.c_str(),
              c.dataset.c_str(), c.model.c_str());
  if (std::isinf(rate)) {
    std::printf("Traffic request rate: inf\n");
  } else {
    std::printf("Traffic request rate: %g\n", rate);
  }
  std::printf("Burstiness factor: %g%s\n", c.burstiness,
              c.burstiness == 1.0 ? " (Poisson process)" : " (Gamma distribution)");
  std::printf("Maximum request concurrency: %s\n",
              c.max_concurrency > 0 ? std::to_string(c.max_concurrency).c_str() : "None");
  if (!c.shard.empty()) {
    std::printf("Shard %s: %zu of %lld requests\n", c.shard.c_str(), session.num_requests(),
                static_cast<long long>(c.num_prompts));
  }
  std::fflush(stdout);
}

// Prepares the session and sends the warm-up request.
Result<BenchSession> start_session(const BenchCli& cli) {
  // A request in flight holds about four descriptors (its socket, and its
  // I/O context's epoll, eventfd and timerfd): a soft limit of 1024 would
  // fail requests part way through a run of many workers.
  const int64_t workers =
      cli.run.max_concurrency > 0 ? cli.run.max_concurrency : loadtest::kMaxInFlight;
  if (Status raised = raise_open_file_limit(uint64_t(4 * workers + 256)); !raised.is_ok()) {
    std::fprintf(stderr, "warning: %s: requests past it may fail\n", raised.message().c_str());
  }
  BATON_ASSIGN_OR_RETURN(BenchSession session, BenchSession::prepare(cli.run));
  std::printf("Starting initial single prompt test run...\n");
  std::fflush(stdout);
  BATON_RETURN_IF_ERROR(session.warm_up());
  std::printf("Initial test run completed. Starting main benchmark run...\n");
  return session;
}

int run_bench(BenchCli& cli, const Metrics& metrics) {
  if (Status s = resolve(cli); !s.is_ok()) return fail(s);
  Result<BenchSession> session = start_session(cli);
  if (!session.is_ok()) return fail(session.status());
  print_start(*session, cli.run.request_rate, cli);
  Result<BenchResult> result = session->run(cli.run.request_rate);
  if (!result.is_ok()) return fail(result.status());
  loadtest::print_report(stdout, *result, metrics);
  const bool detailed = cli.save_detailed || !cli.run.shard.empty();
  if (Status s = save(result_path(cli, session->config().model, cli.request_rate + "qps",
                                  cli.run.max_concurrency),
                      loadtest::result_json(*result, detailed), cli.metadata);
      !s.is_ok())
    return fail(s);
  return 0;
}

// "LABEL=FILE" or "FILE" (the label saved in the file); goodput regraded
// under `slo` when one is given.
Result<loadtest::SweepSeries> load_series(const std::string& spec, const loadtest::Slo& slo) {
  const size_t eq = spec.find('=');
  const std::string file = eq == std::string::npos ? spec : spec.substr(eq + 1);
  BATON_ASSIGN_OR_RETURN(json doc, loadtest::read_json_file(file));
  const bool regrade = slo.any();
  BATON_ASSIGN_OR_RETURN(loadtest::SweepSeries series,
                         loadtest::sweep_series(doc, file, regrade ? &slo : nullptr));
  if (eq != std::string::npos) series.label = spec.substr(0, eq);
  return series;
}

// "goodput: requests with TTFT <= 5000 ms and TPOT <= 60 ms", or "".
std::string goodput_note(const loadtest::Slo& slo) {
  std::vector<std::string> parts;
  auto add = [&](const char* name, const std::optional<double>& ms) {
    if (!ms) return;
    char text[64];
    std::snprintf(text, sizeof(text), "%s <= %g ms", name, *ms);
    parts.push_back(text);
  };
  add("TTFT", slo.ttft_ms);
  add("TPOT", slo.tpot_ms);
  add("E2EL", slo.e2el_ms);
  std::string note;
  for (size_t i = 0; i < parts.size(); ++i) note += (i == 0 ? "" : " and ") + parts[i];
  return note.empty() ? note : "goodput: requests with " + note;
}

int run_sweep(BenchCli& cli, const Metrics& metrics) {
  if (Status s = resolve(cli); !s.is_ok()) return fail(s);
  std::vector<loadtest::SweepSeries> all;
  for (const std::string& spec : cli.compare) {
    auto series = load_series(spec, cli.run.slo);
    if (!series.is_ok()) return fail(series.status());
    all.push_back(std::move(*series));
  }
  if (!cli.rates.empty()) {
    auto rates = loadtest::parse_rates(cli.rates);
    if (!rates.is_ok()) return fail(rates.status());
    Result<BenchSession> session = start_session(cli);
    if (!session.is_ok()) return fail(session.status());
    std::vector<json> runs;
    loadtest::SweepSeries mine{cli.label, {}};
    for (double rate : *rates) {
      print_start(*session, rate, cli);
      Result<BenchResult> result = session->run(rate);
      if (!result.is_ok()) return fail(result.status());
      loadtest::print_report(stdout, *result, metrics);
      runs.push_back(loadtest::result_json(*result, cli.save_detailed));
      auto point = loadtest::sweep_point(runs.back(), "this sweep");
      if (!point.is_ok()) return fail(point.status());
      mine.points.push_back(*point);
    }
    if (Status s = save(result_path(cli, session->config().model, "sweep", cli.run.max_concurrency),
                        loadtest::sweep_json(cli.label, runs));
        !s.is_ok())
      return fail(s);
    all.insert(all.begin(), std::move(mine));
  }
  if (all.empty()) return fail(invalid_argument("give --rates to run a sweep, or --compare files"));
  for (const auto& series : all) loadtest::print_sweep_table(stdout, series);
  std::ofstream out(cli.svg, std::ios::trunc);
  out << loadtest::sweep_chart_svg(all, cli.title, goodput_note(cli.run.slo));
  out.close();
  if (!out) return fail(io_error(cli.svg + ": cannot write the chart"));
  std::printf("Wrote %s\n", cli.svg.c_str());
  return 0;
}

int run_merge(const BenchCli& cli, const Metrics& metrics) {
  std::vector<BenchResult> shards;
  for (const std::string& file : cli.merge_files) {
    auto doc = loadtest::read_json_file(file);
    if (!doc.is_ok()) return fail(doc.status());
    auto shard = loadtest::result_from_json(*doc, file);
    if (!shard.is_ok()) return fail(shard.status());
    shards.push_back(std::move(*shard));
  }
  auto merged = loadtest::merge_results(shards);
  if (!merged.is_ok()) return fail(merged.status());
  loadtest::print_report(stdout, *merged, metrics);
  char rate[32];
  std::snprintf(rate, sizeof rate, "%gqps", merged->config.request_rate);  // inf: "infqps"
  if (Status s = save(result_path(cli, merged->config.model, rate, merged->config.max_concurrency),
                      loadtest::result_json(*merged, cli.save_detailed), cli.metadata);
      !s.is_ok())
    return fail(s);
  return 0;
}

void add_run_options(CLI::App* bench, BenchCli& cli) {
  loadtest::BenchOptions& o = cli.run;
  bench->add_option("--backend", cli.backend, "http, or zmq (the router's ZeroMQ front end)")
      ->capture_default_str();
  bench->add_option("--host", o.address.host, "the router's address")->capture_default_str();
  bench->add_option("--api-key", o.address.api_key,
                    "the router's API key (default: the OPENAI_API_KEY environment variable, as "
                    "vllm bench serve reads it)");
  bench->add_option("--port", cli.port, "the router's http_port (default 8000) or zmq_port (8001)");
  bench->add_option("--zmq-keys", cli.zmq_keys,
                    "zmq: the front end's CURVE keys (router.pub and the client pair that "
                    "`baton keygen --clients` wrote; the router's router.zmq_keys)");
  bench->add_option("--endpoint", o.endpoint, "/v1/completions or /v1/chat/completions")
      ->capture_default_str();
  bench->add_option("--model", o.model, "the model name (default: the router's /v1/models)");
  bench->add_option("--request-timeout", cli.timeout_s, "seconds one request may take")
      ->capture_default_str();
  bench->add_option("--dataset-name", o.dataset, "random, prefix or sharegpt")
      ->capture_default_str();
  bench->add_option("--dataset-path", o.dataset_path, "sharegpt: a JSONL file of conversations");
  bench->add_option("--num-prompts", o.num_prompts, "requests in the run (all shards together)")
      ->capture_default_str();
  bench->add_option("--request-rate", cli.request_rate, "requests/s of the whole run, or inf")
      ->capture_default_str();
  bench->add_option("--burstiness", o.burstiness, "gamma shape of the gaps; 1 = Poisson")
      ->capture_default_str();
  // A worker a request in flight, each with its descriptors and socket: the
  // open-file and socket limits the bench raises are sized for 1024.
  bench
      ->add_option("--max-concurrency", o.max_concurrency,
                   "requests in flight at most, up to 1024 (0: one worker per request, at most "
                   "1024)")
      ->check(CLI::Range(int64_t(0), loadtest::kMaxInFlight));
  bench->add_option("--seed", o.seed, "seeds the request list and the schedule")
      ->capture_default_str();
  bench->add_option("--random-input-len", o.random.input_len, "random: prompt tokens")
      ->capture_default_str();
  bench->add_option("--random-output-len", o.random.output_len, "random: output tokens")
      ->capture_default_str();
  bench
      ->add_option("--random-range-ratio", o.random.range_ratio,
                   "random: lengths uniform in len*(1-r)..len*(1+r)")
      ->capture_default_str();
  bench
      ->add_option("--random-prefix-len", o.random.prefix_len,
                   "random: tokens every prompt starts with (the same for all), before its own")
      ->capture_default_str();
  bench->add_option("--prefix-len", o.prefix.prefix_len, "prefix: shared prefix tokens")
      ->capture_default_str();
  bench->add_option("--prefix-suffix-len", o.prefix.suffix_len, "prefix: tokens after the prefix")
      ->capture_default_str();
  bench->add_option("--prefix-num-prefixes", o.prefix.num_prefixes, "prefix: groups")
      ->capture_default_str();
  bench->add_option("--prefix-output-len", o.prefix.output_len, "prefix: output tokens")
      ->capture_default_str();
  bench->add_option("--sharegpt-output-len", o.sharegpt_output_len,
                    "sharegpt: output tokens (default: the reply's length in bytes)");
  bench->add_option("--vocab-size", o.vocab_size, "prompt token ids are below this")
      ->capture_default_str();
  bench->add_option("--temperature", o.sampling.temperature, "sampling temperature (0: greedy)")
      ->capture_default_str();
  bench->add_option("--goodput", cli.goodput, "service-level objectives: ttft:MS tpot:MS e2el:MS");
  bench
      ->add_option("--percentile-metrics", cli.percentile_metrics,
                   "sections of the table: ttft,tpot,itl,e2el")
      ->capture_default_str();
  bench
      ->add_option("--metric-percentiles", cli.metric_percentiles,
                   "percentiles each section gives besides mean and median, e.g. 25,50,99.9")
      ->capture_default_str();
  bench->add_option("--shard", o.shard, "i/N: send requests i, i+N, ... of the seeded list");
}

}  // namespace

std::function<int()> add_bench_command(CLI::App& app) {
  auto cli = std::make_shared<BenchCli>();
  CLI::App* bench = app.add_subcommand("bench", "Load-test a router (as vllm bench serve)");
  add_run_options(bench, *cli);
  bench
      ->add_option("--save-result", cli->save_result,
                   "write the result as JSON: to FILE, or (vLLM's switch) to --result-dir/"
                   "--result-filename, by default {label}-{rate}qps-{model}-{time}.json")
      ->expected(0, 1);
  bench->add_option("--result-dir", cli->result_dir, "directory of the saved result");
  bench->add_option("--result-filename", cli->result_filename, "file name of the saved result");
  bench->add_option("--label", cli->run_label, "prefix of the saved result's default name");
  bench->add_option("--metadata", cli->metadata, "KEY=VALUE pairs written into the saved result");
  bench->add_option("--base-url", cli->base_url, "the router, as http://host:port (vLLM's)");
  bench->add_flag("--ignore-eos", cli->ignore_eos,
                  "accepted for vLLM's command lines: Baton's requests always ignore EOS, so "
                  "outputs have the asked length");
  for (const char* flag : kUnsupportedVllmFlags) {
    bench
        ->add_option_function<std::string>(
            flag, [cli, flag](const std::string&) { cli->unsupported.push_back(flag); },
            "(vllm bench serve's; refused)")
        ->expected(0, 1)
        ->group("");
  }
  bench->add_flag("--save-detailed", cli->save_detailed, "add per-request lists to the saved JSON");
  CLI::App* sweep = bench->add_subcommand("sweep", "Run at several request rates; draw the chart");
  sweep->fallthrough();
  sweep->add_option("--rates", cli->rates, "request rates, e.g. 1,2,4,8");
  sweep->add_option("--label", cli->label, "this configuration's name in the chart")
      ->capture_default_str();
  sweep->add_option("--svg", cli->svg, "the chart's file")->capture_default_str();
  sweep->add_option("--title", cli->title, "the chart's title");
  sweep->add_option("--compare", cli->compare,
                    "LABEL=FILE: another saved sweep to draw beside this one (repeatable); "
                    "with --goodput, its goodput is computed again under those objectives");
  CLI::App* merge = bench->add_subcommand("merge", "Join the saved results of shards of one run");
  merge->fallthrough();
  merge->add_option("files", cli->merge_files, "results saved with --shard")->required();
  return [cli, sweep, merge] {
    std::signal(SIGPIPE, SIG_IGN);
    auto metrics = loadtest::parse_percentile_metrics(cli->percentile_metrics);
    if (!metrics.is_ok()) return fail(metrics.status());
    if (sweep->parsed()) return run_sweep(*cli, *metrics);
    if (merge->parsed()) return run_merge(*cli, *metrics);
    return run_bench(*cli, *metrics);
  };
}

}  // namespace baton::tools

#include "tools/loadtest/result_json.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <fstream>
#include <limits>
#include <string_view>

#include <fmt/format.h>

#include "common/regular_file.h"
#include "tools/loadtest/workload.h"

namespace baton::loadtest {
namespace {

using json = nlohmann::json;

// vLLM's "date" field: local time of the start, 20250101-120000.
std::string date_string(double unix_seconds) {
  const auto seconds = std::time_t(unix_seconds);
  std::tm local{};
  localtime_r(&seconds, &local);
  char text[32];
  std::strftime(text, sizeof(text), "%Y%m%d-%H%M%S", &local);
  return text;
}

json optional_number(const std::optional<double>& value) {
  return value ? json(*value) : json(nullptr);
}

// vLLM's keys; p99 always (Baton's sweeps and charts read it), and each
// percentile --metric-percentiles asked for.
void put_distribution(json& doc, const std::string& metric, const Distribution& d,
                      const std::vector<double>& percentiles) {
  // fmt, not "literal" + std::string: GCC 12 warns falsely (-Wrestrict) on those.
  const auto key = [&](std::string_view statistic) {
    return fmt::format("{}_{}_ms", statistic, metric);
  };
  doc[key("mean")] = d.mean;
  doc[key("median")] = d.median;
  doc[key("std")] = d.stddev;
  doc[key("p99")] = d.p99;
  for (double pct : percentiles) {
    doc[fmt::format("p{}_{}_ms", percentile_word(pct), metric)] = d.percentile_ms(pct);
  }
}

json summary_json(const ServingSummary& s, const std::vector<double>& percentiles) {
  json doc = {{"duration", s.duration_s},
              {"completed", s.completed},
              {"failed", s.failed},
              {"total_input_tokens", s.total_input_tokens},
              {"total_output_tokens", s.total_output_tokens},
              {"request_throughput", s.request_throughput},
              {"request_goodput", optional_number(s.request_goodput)},
              {"output_throughput", s.output_throughput},
              {"total_token_throughput", s.total_token_throughput}};
  put_distribution(doc, "ttft", s.ttft_ms, percentiles);
  put_distribution(doc, "tpot", s.tpot_ms, percentiles);
  put_distribution(doc, "itl", s.itl_ms, percentiles);
  put_distribution(doc, "e2el", s.e2el_ms, percentiles);
  return doc;
}

json slo_json(const Slo& slo) {
  if (!slo.any()) return nullptr;
  json doc = json::object();
  if (slo.ttft_ms) doc["ttft"] = *slo.ttft_ms;
  if (slo.tpot_ms) doc["tpot"] = *slo.tpot_ms;
  if (slo.e2el_ms) doc["e2el"] = *slo.e2el_ms;
  return doc;
}

// Reads `doc[key]` into `out` if present with the right type; errors name it.
template <typename T>
Status read_field(const json& doc, const char* key, T* out, const std::string& name) {
  auto it = doc.find(key);
  if (it == doc.end() || it->is_null()) return Status::ok();
  try {
    *out = it->get<T>();
  } catch (const json::exception&) {
    return invalid_argument(name + ": \"" + key + "\" has the wrong type");
  }
  return Status::ok();
}

Status read_config(const json& doc, BenchConfig* config, const std::string& name) {
  BATON_RETURN_IF_ERROR(read_field(doc, "backend", &config->backend, name));
  BATON_RETURN_IF_ERROR(read_field(doc, "endpoint", &config->endpoint, name));
  BATON_RETURN_IF_ERROR(read_field(doc, "model_id", &config->model, name));
  BATON_RETURN_IF_ERROR(read_field(doc, "dataset", &config->dataset, name));
  BATON_RETURN_IF_ERROR(read_field(doc, "num_prompts", &config->num_prompts, name));
  BATON_RETURN_IF_ERROR(read_field(doc, "burstiness", &config->burstiness, name));
  BATON_RETURN_IF_ERROR(read_field(doc, "max_concurrency", &config->max_concurrency, name));
  BATON_RETURN_IF_ERROR(read_field(doc, "seed", &config->seed, name));
  BATON_RETURN_IF_ERROR(read_field(doc, "shard", &config->shard, name));
  BATON_RETURN_IF_ERROR(read_field(doc, "metric_percentiles", &config->metric_percentiles, name));
  const json rate = doc.value("request_rate", json());
  config->request_rate =
      rate.is_number() ? rate.get<double>() : std::numeric_limits<double>::infinity();
  const json goodput = doc.value("goodput", json());
  if (goodput.is_object()) {
    for (auto [key, target] :
         {std::pair{"ttft", &config->slo.ttft_ms}, std::pair{"tpot", &config->slo.tpot_ms},
          std::pair{"e2el", &config->slo.e2el_ms}}) {
      if (goodput.contains(key) && goodput[key].is_number()) *target = goodput[key].get<double>();
    }
  }
  return Status::ok();
}

}  // namespace

json result_json(const BenchResult& result, bool detailed) {
  const BenchConfig& c = result.config;
  json doc = {{"date", date_string(result.started_at_unix)},
              {"backend", c.backend},
              {"endpoint", c.endpoint},
              {"model_id", c.model},
              {"dataset", c.dataset},
              {"num_prompts", c.num_prompts},
              {"request_rate", std::isinf(c.request_rate) ? json("inf") : json(c.request_rate)},
              {"burstiness", c.burstiness},
              {"max_concurrency", c.max_concurrency > 0 ? json(c.max_concurrency) : json(nullptr)},
              {"seed", c.seed},
              {"shard", c.shard.empty() ? json(nullptr) : json(c.shard)},
              {"goodput", slo_json(c.slo)},
              {"metric_percentiles", c.metric_percentiles},
              {"started_at", result.started_at_unix}};
  doc.update(summary_json(result.summary(), c.metric_percentiles));
  json nodes = json::array();
  for (const NodeShare& share : per_node(result)) {
    json node = summary_json(share.summary, c.metric_percentiles);
    node["role"] = share.role;
    node["node"] = share.node;
    nodes.push_back(std::move(node));
  }
  doc["per_node"] = std::move(nodes);
  if (!detailed) return doc;
  json input_lens = json::array(), output_lens = json::array(), ttfts = json::array(),
       itls = json::array(), e2els = json::array(), starts = json::array(), errors = json::array(),
       served = json::array();
  for (const RequestRecord& r : result.records) {
    input_lens.push_back(r.prompt_tokens);
    output_lens.push_back(r.success ? r.output_tokens : 0);
    ttfts.push_back(r.ttft_s);
    itls.push_back(r.itl_s);
    e2els.push_back(r.e2el_s);
    starts.push_back(r.start_s);
    errors.push_back(r.error);
    served.push_back({{"prefill", r.prefill_node.empty() ? json(nullptr) : json(r.prefill_node)},
                      {"decode", r.decode_node.empty() ? json(nullptr) : json(r.decode_node)}});
  }
  doc["input_lens"] = std::move(input_lens);
  doc["output_lens"] = std::move(output_lens);
  doc["ttfts"] = std::move(ttfts);
  doc["itls"] = std::move(itls);
  doc["e2els"] = std::move(e2els);
  doc["start_times"] = std::move(starts);
  doc["errors"] = std::move(errors);
  doc["served_by"] = std::move(served);
  return doc;
}

Result<BenchResult> result_from_json(const json& doc, const std::string& name) {
  if (!doc.is_object()) return invalid_argument(name + ": not a JSON object");
  BenchResult result;
  BATON_RETURN_IF_ERROR(read_config(doc, &result.config, name));
  BATON_RETURN_IF_ERROR(read_field(doc, "started_at", &result.started_at_unix, name));
  BATON_RETURN_IF_ERROR(read_field(doc, "duration", &result.duration_s, name));
  static const char* kLists[] = {"input_lens", "output_lens", "ttfts",  "itls",
                                 "e2els",      "start_times", "errors", "served_by"};
  for (const char* key : kLists) {
    if (!doc.contains(key) || !doc[key].is_array()) {
      return invalid_argument(name + ": no per-request \"" + key +
                              "\" list; save results with --save-detailed (or --shard)");
    }
    if (doc[key].size() != doc["errors"].size())
      return invalid_argument(name + ": the per-request lists differ in length");
  }
  try {
    for (size_t i = 0; i < doc["errors"].size(); ++i) {
      RequestRecord r;
      r.error = doc["errors"][i].get<std::string>();
      r.success = r.error.empty();
      r.prompt_tokens = doc["input_lens"][i].get<int64_t>();
      r.output_tokens = doc["output_lens"][i].get<int64_t>();
      r.ttft_s = doc["ttfts"][i].get<double>();
      r.itl_s = doc["itls"][i].get<std::vector<double>>();
      r.e2el_s = doc["e2els"][i].get<double>();
      r.start_s = doc["start_times"][i].get<double>();
      const json& served = doc["served_by"][i];
      if (served.value("prefill", json()).is_string()) r.prefill_node = served["prefill"];
      if (served.value("decode", json()).is_string()) r.decode_node = served["decode"];
      result.records.push_back(std::move(r));
    }
  } catch (const json::exception& e) {
    return invalid_argument(name + ": a per-request entry has the wrong type: " + e.what());
  }
  return result;
}

namespace {

// Shards of one run (--shard i/N): N results, each of the N once, all of
// the same run (num_prompts, seed, rate). A shard given twice would count
// its requests twice; one left out would report part of a run as the whole.
Status check_shards_complete(const std::vector<BenchResult>& shards) {
  std::vector<bool> seen(shards.size(), false);
  const BenchConfig& first = shards.front().config;
  for (const BenchResult& result : shards) {
    const BenchConfig& c = result.config;
    if (c.shard.empty()) {
      return invalid_argument("a result without --shard: merge joins the shards of one run");
    }
    BATON_ASSIGN_OR_RETURN(const Shard shard, parse_shard(c.shard));
    if (shard.count != int64_t(shards.size())) {
      return invalid_argument("shard " + c.shard + ": a run of " + std::to_string(shard.count) +
                              " shards, " + std::to_string(shards.size()) + " results given");
    }
    if (c.num_prompts != first.num_prompts || c.seed != first.seed ||
        c.request_rate != first.request_rate) {
      return invalid_argument("shard " + c.shard + " is of another run than shard " + first.shard +
                              " (num_prompts, seed or rate differ)");
    }
    if (seen[size_t(shard.index)]) return invalid_argument("shard " + c.shard + " given twice");
    seen[size_t(shard.index)] = true;
  }
  return Status::ok();  // N distinct indices below N: every shard is there
}

}  // namespace

Result<BenchResult> merge_results(const std::vector<BenchResult>& shards) {
  if (shards.empty()) return invalid_argument("no results to merge");
  BenchResult merged;
  merged.config = shards.front().config;
  merged.config.shard.clear();
  double start = shards.front().started_at_unix, end = start;
  for (const BenchResult& shard : shards) {
    if (shard.config.model != merged.config.model) {
      return invalid_argument("results of different models: '" + merged.config.model + "' and '" +
                              shard.config.model + "'");
    }
    start = std::min(start, shard.started_at_unix);
    end = std::max(end, shard.started_at_unix + shard.duration_s);
  }
  BATON_RETURN_IF_ERROR(check_shards_complete(shards));
  for (const BenchResult& shard : shards) {
    for (RequestRecord r : shard.records) {
      r.start_s += shard.started_at_unix - start;
      merged.records.push_back(std::move(r));
    }
  }
  merged.config.num_prompts = int64_t(merged.records.size());
  merged.started_at_unix = start;
  merged.duration_s = end - start;
  return merged;
}

Result<json> read_json_file(const std::string& path) {
  BATON_RETURN_IF_ERROR(check_regular_file(path));
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open");
  json doc = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return invalid_argument(path + ": not valid JSON");
  return doc;
}

Status write_json_file(const std::string& path, const json& doc) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return io_error(path + ": cannot write");
  out << doc.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
  out.close();
  if (!out) return io_error(path + ": write failed");
  return Status::ok();
}

}  // namespace baton::loadtest

// `baton bench` against a real local cluster (`baton up`): short runs over
// HTTP and ZeroMQ complete without failures, their token counts match what
// the router counted (/metrics), the saved JSON has vLLM's keys, shards merge,
// and a warm-up request that fails stops the run with a clear message.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "tests/integration/cluster_harness.h"

namespace baton::testing {
namespace {

using json = nlohmann::json;

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return json::parse(in, nullptr, /*allow_exceptions=*/false);
}

class BenchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = new Cluster(ClusterShape{}); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("baton-bench-test-" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // A counter of the router's /metrics (summed over its label sets).
  static double metric(const std::string& name) { return cluster_->metric(name); }

  // `baton bench` with a short random workload; `extra` flags appended.
  static BatonRun short_run(const std::string& backend, int prompts,
                            const std::vector<std::string>& extra, int input_len = kInputLen) {
    const uint16_t port = backend == "zmq" ? cluster_->zmq_port() : cluster_->http_port();
    std::vector<std::string> args = {"bench",
                                     "--backend",
                                     backend,
                                     "--port",
                                     std::to_string(port),
                                     "--num-prompts",
                                     std::to_string(prompts),
                                     "--random-input-len",
                                     std::to_string(input_len),
                                     "--random-output-len",
                                     std::to_string(kOutputLen),
                                     "--max-concurrency",
                                     "4",
                                     "--seed",
                                     "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_baton(args);
  }

  static constexpr int kInputLen = 32, kOutputLen = 16;
  static Cluster* cluster_;
  std::filesystem::path dir_;
};
Cluster* BenchTest::cluster_ = nullptr;

TEST_F(BenchTest, HttpRunCountsWhatTheRouterCounts) {
  const double prompt_before = metric("vllm:prompt_tokens_total");
  const double generated_before = metric("vllm:generation_tokens_total");
  const auto result_file = dir_ / "result.json";
  BatonRun bench = short_run("http", 20,
                             {"--request-rate", "inf", "--save-result", result_file.string(),
                              "--save-detailed", "--goodput", "ttft:60000"});
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  EXPECT_NE(bench.output.find("Successful requests:                     20"), std::string::npos)
      << bench.output;
  EXPECT_NE(bench.output.find("Request goodput (req/s):"), std::string::npos);

  json result = read_json(result_file);
  ASSERT_TRUE(result.is_object()) << "no JSON in " << result_file;
  // vLLM's keys (all of them are checked in loadtest_test), per request with --save-detailed.
  for (const char* key : {"request_throughput", "output_throughput", "mean_ttft_ms", "p99_tpot_ms",
                          "mean_itl_ms", "input_lens", "itls", "per_node"}) {
    EXPECT_TRUE(result.contains(key)) << key;
  }
  EXPECT_EQ(result["model_id"], "tiny");
  EXPECT_EQ(result["completed"], 20);
  EXPECT_EQ(result["failed"], 0);
  EXPECT_EQ(result["total_output_tokens"], 20 * kOutputLen);
  int64_t prompt_sum = 0;
  for (const auto& length : result["input_lens"]) prompt_sum += length.get<int64_t>();
  EXPECT_EQ(prompt_sum, 20 * kInputLen);
  EXPECT_EQ(result["total_input_tokens"], prompt_sum);
  EXPECT_DOUBLE_EQ(result["request_goodput"].get<double>(),
                   result["request_throughput"].get<double>());
  ASSERT_EQ(result["itls"].size(), 20u);
  for (const auto& itls : result["itls"]) EXPECT_EQ(itls.size(), size_t(kOutputLen - 1));
  ASSERT_EQ(result["served_by"].size(), 20u);
  for (const auto& served : result["served_by"]) {
    EXPECT_EQ(served["prefill"], "prefill-0");  // 32 tokens >= min_remote_prefill_tokens
    EXPECT_EQ(served["decode"], "decode-0");
  }
  ASSERT_EQ(result["per_node"].size(), 2u);
  EXPECT_EQ(result["per_node"][0]["node"], "prefill-0");
  EXPECT_EQ(result["per_node"][1]["completed"], 20);

  // The router counted the same tokens, plus the warm-up request's.
  EXPECT_EQ(metric("vllm:prompt_tokens_total") - prompt_before, prompt_sum + kInputLen);
  EXPECT_EQ(metric("vllm:generation_tokens_total") - generated_before, 21 * kOutputLen);
  EXPECT_TRUE(cluster_->wait_drained(std::chrono::seconds(5)));
}

// A command line in the shape of vLLM's docs (`vllm bench serve --backend
// vllm --model M --endpoint /v1/completions --dataset-name random ...
// --save-result --result-dir DIR`), with vLLM's flags for the address, the
// result's file and its metadata; and a vLLM flag Baton does not take,
// refused by name.
TEST_F(BenchTest, VllmCommandLinesRun) {
  const std::string base_url = "http://127.0.0.1:" + std::to_string(cluster_->http_port());
  BatonRun bench = run_baton({"bench",
                              "--backend",
                              "vllm",
                              "--base-url",
                              base_url,
                              "--model",
                              "tiny",
                              "--endpoint",
                              "/v1/completions",
                              "--dataset-name",
                              "random",
                              "--random-input-len",
                              "16",
                              "--random-output-len",
                              "4",
                              "--num-prompts",
                              "6",
                              "--ignore-eos",
                              "--save-result",
                              "--result-dir",
                              (dir_ / "results").string(),
                              "--result-filename",
                              "run.json",
                              "--metadata",
                              "gpu=none",
                              "tp=1",
                              "--metric-percentiles",
                              "50,90",
                              "--random-prefix-len",
                              "8"});
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  EXPECT_NE(bench.output.find("P90 TTFT (ms):"), std::string::npos) << bench.output;
  json result = read_json(dir_ / "results" / "run.json");
  ASSERT_TRUE(result.is_object()) << bench.output;
  EXPECT_EQ(result["completed"], 6);
  EXPECT_TRUE(result.contains("p90_tpot_ms")) << result.dump();
  EXPECT_EQ(result["total_input_tokens"], 6 * (8 + 16));  // the prefix, then each prompt's own
  EXPECT_EQ(result["gpu"], "none");
  EXPECT_EQ(result["tp"], "1");

  // --save-result alone: vLLM's default name in --result-dir, with --label.
  bench = run_baton({"bench", "--base-url", base_url, "--num-prompts", "2", "--random-input-len",
                     "8", "--random-output-len", "2", "--save-result", "--result-dir",
                     (dir_ / "named").string(), "--label", "mine"});
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_ / "named")) {
    const std::string name = entry.path().filename().string();
    EXPECT_TRUE(name.starts_with("mine-infqps-tiny-") && name.ends_with(".json")) << name;
    ++files;
  }
  EXPECT_EQ(files, 1u);

  bench = run_baton({"bench", "--base-url", base_url, "--tokenizer", "meta-llama/Llama-3.1-8B"});
  EXPECT_NE(bench.exit_code, 0);
  EXPECT_NE(bench.output.find("--tokenizer is a vllm bench serve flag Baton does not take"),
            std::string::npos)
      << bench.output;
  bench = run_baton({"bench", "--base-url", "https://example.com:8000"});
  EXPECT_NE(bench.exit_code, 0);
  EXPECT_NE(bench.output.find("--base-url"), std::string::npos) << bench.output;
}

TEST_F(BenchTest, ZmqRunCompletes) {
  BatonRun bench =
      short_run("zmq", 8, {"--request-rate", "100", "--save-result", (dir_ / "zmq.json").string()});
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  json result = read_json(dir_ / "zmq.json");
  EXPECT_EQ(result["backend"], "zmq");
  EXPECT_EQ(result["completed"], 8);
  EXPECT_EQ(result["failed"], 0);
  EXPECT_EQ(result["total_output_tokens"], 8 * kOutputLen);
  EXPECT_EQ(result["total_input_tokens"], 8 * kInputLen);
}

TEST_F(BenchTest, ShardsMergeIntoOneRun) {
  std::vector<BatonRun> shards(2);
  std::vector<std::thread> hosts;
  for (int i = 0; i < 2; ++i) {
    hosts.emplace_back([&, i] {
      shards[size_t(i)] =
          short_run("http", 9,
                    {"--request-rate", "40", "--shard", std::to_string(i) + "/2", "--save-result",
                     (dir_ / ("shard" + std::to_string(i) + ".json")).string()});
    });
  }
  for (auto& host : hosts) host.join();
  for (const BatonRun& shard : shards) ASSERT_EQ(shard.exit_code, 0) << shard.output;
  EXPECT_EQ(read_json(dir_ / "shard0.json")["completed"], 5);  // requests 0, 2, 4, 6, 8
  EXPECT_EQ(read_json(dir_ / "shard1.json")["completed"], 4);
  BatonRun merge =
      run_baton({"bench", "merge", (dir_ / "shard0.json").string(), (dir_ / "shard1.json").string(),
                 "--save-result", (dir_ / "merged.json").string()});
  ASSERT_EQ(merge.exit_code, 0) << merge.output;
  json merged = read_json(dir_ / "merged.json");
  EXPECT_EQ(merged["completed"], 9);
  EXPECT_EQ(merged["total_output_tokens"], 9 * kOutputLen);
  // vLLM's form of the flags names the file too; a shard given twice (and
  // so the other left out) is refused.
  BatonRun vllm_flags =
      run_baton({"bench", "merge", (dir_ / "shard0.json").string(), (dir_ / "shard1.json").string(),
                 "--save-result", "--result-dir", dir_.string(), "--result-filename", "m2.json"});
  ASSERT_EQ(vllm_flags.exit_code, 0) << vllm_flags.output;
  EXPECT_EQ(read_json(dir_ / "m2.json")["completed"], 9);
  BatonRun twice = run_baton(
      {"bench", "merge", (dir_ / "shard0.json").string(), (dir_ / "shard0.json").string()});
  EXPECT_NE(twice.exit_code, 0) << twice.output;
  EXPECT_NE(twice.output.find("shard 0/2 given twice"), std::string::npos) << twice.output;
}

TEST_F(BenchTest, FailedWarmUpStopsTheRunWithTheReason) {
  BatonRun bench = short_run("http", 4, {}, /*input_len=*/5000);  // over max_model_len
  EXPECT_EQ(bench.exit_code, 1);
  EXPECT_NE(bench.output.find("the warm-up request failed, so the benchmark did not start"),
            std::string::npos)
      << bench.output;
  EXPECT_NE(bench.output.find("maximum context length is 1024 tokens"), std::string::npos)
      << bench.output;
  EXPECT_EQ(bench.output.find("Serving Benchmark Result"), std::string::npos);
}

}  // namespace
}  // namespace baton::testing

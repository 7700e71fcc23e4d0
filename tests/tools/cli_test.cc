// The `baton` binary as users run it: a real process, its stdout and exit code.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>
#include <string>

#include "engine/engine_config.h"
#include "kernels/cpu/cpu_features.h"

namespace {

struct RunResult {
  int exit_code;
  std::string out;  // stdout and stderr together
};

RunResult run(const std::string& args) {
  std::string command = std::string(BATON_BINARY) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string out;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) out.append(buffer.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::vector<nlohmann::json> json_lines(const std::string& out) {
  std::vector<nlohmann::json> docs;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.empty() && line[0] == '{') docs.push_back(nlohmann::json::parse(line));
  }
  return docs;
}

class BatonCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("baton-cli-" + std::to_string(std::random_device{}())));
    auto made = run("make-model --preset tiny --seed 3 --out " + model().string());
    ASSERT_EQ(made.exit_code, 0) << made.out;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::filesystem::path model() { return *dir_ / "tiny"; }
  static std::filesystem::path* dir_;
};
std::filesystem::path* BatonCli::dir_ = nullptr;

// What no sampling could mean is refused naming the flag, before any token
// is generated: NaN, a seed that would wrap, a prompts file that never ends.
TEST_F(BatonCli, GenerateRefusesSamplingValuesAndFilesItCannotUse) {
  const std::string base = "generate --model " + model().string() + " --max-tokens 2 ";
  for (const auto& [args, named] : std::vector<std::pair<std::string, std::string>>{
           {"--prompt-ids 1,2 --temperature nan", "temperature"},
           {"--prompt-ids 1,2 --min-p nan", "min_p"},
           {"--prompt-ids 1,2 --repetition-penalty nan", "repetition_penalty"},
           {"--prompt-ids 1,2 --logit-bias 3:nan", "--logit-bias takes ID:BIAS"},
           {"--prompt-ids 1,2 --logit-bias 3:", "--logit-bias takes ID:BIAS"},
           {"--prompt-ids 1,2 --logit-bias 3:1.5x", "--logit-bias takes ID:BIAS"},
           {"--prompt-ids 1,2 --logit-bias 4294967299:1", "--logit-bias takes ID:BIAS"},
           {"--prompt-ids 1,2 --seed -1", "--seed"},
           {"--prompt-ids 1,2 --top-k -5", "--top-k"},
           {"--prompts /dev/zero", "--prompts: /dev/zero"}}) {
    auto refused = run(base + args);
    EXPECT_NE(refused.exit_code, 0) << args;
    EXPECT_NE(refused.out.find(named), std::string::npos) << args << ": " << refused.out;
  }
  auto fine = run(base + "--prompt-ids 1,2 --temperature 0.5 --seed 7 --top-k -1");
  EXPECT_EQ(fine.exit_code, 0) << fine.out;
}

TEST_F(BatonCli, GenerateJsonBatchEqualsEachPromptAlone) {
  // CRLF line ends, as a file written on Windows has them.
  std::ofstream(*dir_ / "prompts.txt") << "hello\r\nids:1,20,30,40\r\nBaton runs\r\n";
  auto batch = run("generate --model " + model().string() + " --prompts " +
                   (*dir_ / "prompts.txt").string() +
                   " --max-tokens 6 --temperature 0 --ignore-eos --json --logprobs 3");
  ASSERT_EQ(batch.exit_code, 0) << batch.out;
  auto docs = json_lines(batch.out);
  ASSERT_EQ(docs.size(), 3u) << batch.out;
  EXPECT_NE(batch.out.find("stats: 3 prompts"), std::string::npos);
  for (const auto& doc : docs) {
    ASSERT_EQ(doc["output_ids"].size(), 6u);
    ASSERT_EQ(doc["logprobs"].size(), 6u);
    for (size_t i = 0; i < 6; ++i) {
      const auto& lp = doc["logprobs"][i];
      EXPECT_EQ(lp["id"], doc["output_ids"][i]);
      ASSERT_EQ(lp["top"].size(), 3u);
      // Greedy: the chosen token is the most likely one.
      EXPECT_EQ(lp["top"][0]["id"], lp["id"]);
      EXPECT_LE(lp["logprob"].get<double>(), 0.0);
    }
  }
  EXPECT_EQ(docs[1]["prompt_ids"], nlohmann::json::array({1, 20, 30, 40}));
  auto alone = run("generate --model " + model().string() +
                   " --prompt-ids 1,20,30,40 --max-tokens 6 --temperature 0 --ignore-eos --json");
  ASSERT_EQ(alone.exit_code, 0) << alone.out;
  EXPECT_EQ(json_lines(alone.out).at(0)["output_ids"], docs[1]["output_ids"]);
}

// Prompts that start alike: once the first one's blocks are computed (a
// small step budget admits the second a few steps later), the second shares
// them; the stats line counts the tokens it did not compute, and the outputs
// are those of an engine with the cache off.
TEST_F(BatonCli, PromptsStartingAlikeShareThePrefixCache) {
  const std::string prefix = "Baton moves KV blocks from prefill to decode nodes. ";
  std::ofstream(*dir_ / "alike.txt") << prefix << "One\n" << prefix << "Two\n";
  const std::string args = "generate --model " + model().string() + " --prompts " +
                           (*dir_ / "alike.txt").string() +
                           " --max-tokens 4 --temperature 0 --ignore-eos --json --block-size 4"
                           " --max-num-batched-tokens 8";
  auto cached = run(args);
  ASSERT_EQ(cached.exit_code, 0) << cached.out;
  std::smatch hits;
  ASSERT_TRUE(
      std::regex_search(cached.out, hits, std::regex("(\\d+) prompt tokens from the prefix cache")))
      << cached.out;
  // The second prompt's blocks within the shared prefix, all but the last token's.
  EXPECT_EQ(std::stoi(hits[1]), int(prefix.size()) / 4 * 4) << cached.out;
  auto uncached = run(args + " --enable-prefix-caching false");
  ASSERT_EQ(uncached.exit_code, 0) << uncached.out;
  EXPECT_NE(uncached.out.find(" 0 prompt tokens from the prefix cache"), std::string::npos)
      << uncached.out;
  const auto a = json_lines(cached.out), b = json_lines(uncached.out);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(a[i]["output_ids"], b[i]["output_ids"]);
}

// A pool that holds one prompt at a time, with an SSD tier: the second
// prompt evicts the first one's blocks to SSD, and the first prompt again
// reads them back from there. The stats line says so, the outputs are those
// of an engine with no cache, and the tier's file is gone after the run.
TEST_F(BatonCli, SsdTierBringsBackAnEvictedPrompt) {
  const std::string first =
      "Cold KV blocks go to SSD and come back on a prefix hit, not recomputed.";
  const std::string second = "Another prompt of about the same length fills the small KV pool up.";
  std::ofstream(*dir_ / "again.txt") << first << "\n" << second << "\n" << first << "\n";
  const std::filesystem::path ssd = *dir_ / "ssd";
  std::filesystem::create_directories(ssd);
  const std::string args = "generate --model " + model().string() + " --prompts " +
                           (*dir_ / "again.txt").string() +
                           " --max-tokens 4 --temperature 0 --ignore-eos --json --block-size 4"
                           " --max-num-seqs 1 --kv-cache-blocks 24";
  auto tiered = run(args + " --ssd-cache-dir " + ssd.string());
  ASSERT_EQ(tiered.exit_code, 0) << tiered.out;
  std::smatch hits;
  ASSERT_TRUE(
      std::regex_search(tiered.out, hits, std::regex("(\\d+) from SSD, (\\d+) blocks saved there")))
      << tiered.out;
  EXPECT_GT(std::stoi(hits[1]), 0) << tiered.out;
  EXPECT_GT(std::stoi(hits[2]), 0) << tiered.out;
  EXPECT_TRUE(std::filesystem::is_empty(ssd)) << "the tier's file outlived the run";
  auto uncached = run(args + " --enable-prefix-caching false");
  ASSERT_EQ(uncached.exit_code, 0) << uncached.out;
  EXPECT_EQ(uncached.out.find("from SSD"), std::string::npos) << uncached.out;
  const auto a = json_lines(tiered.out), b = json_lines(uncached.out);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a[i]["output_ids"], b[i]["output_ids"]);
}

// Without --json, --logprobs prints a line per generated token under the
// text, the same numbers the JSON holds; the stats line sizes the KV it used.
TEST_F(BatonCli, LogprobsAsTextMatchTheJson) {
  const std::string args = "generate --model " + model().string() +
                           " --prompt-ids 1,20,30 --max-tokens 4 --temperature 0.8 --seed 11"
                           " --ignore-eos --logprobs 2";
  auto text = run(args);
  auto json = run(args + " --json");
  ASSERT_EQ(text.exit_code, 0) << text.out;
  ASSERT_EQ(json.exit_code, 0) << json.out;
  const auto doc = json_lines(json.out).at(0);
  ASSERT_EQ(doc["logprobs"].size(), 4u);
  std::istringstream lines(text.out);
  std::string line;
  std::vector<std::string> token_lines;
  while (std::getline(lines, line)) {
    if (line.rfind("  ", 0) == 0) token_lines.push_back(line);
  }
  ASSERT_EQ(token_lines.size(), 4u) << text.out;
  // Each line less its tokens' quoted pieces: "  id logprob | top: id logprob, id logprob".
  const std::regex piece(R"( "(?:[^"\\]|\\.)*")");
  for (size_t i = 0; i < 4; ++i) {
    const auto& lp = doc["logprobs"][i];
    const auto& top = lp["top"];
    char want[128];
    std::snprintf(want, sizeof want, "  %d %.4f | top: %d %.4f, %d %.4f", lp["id"].get<int>(),
                  lp["logprob"].get<double>(), top[0]["id"].get<int>(),
                  top[0]["logprob"].get<double>(), top[1]["id"].get<int>(),
                  top[1]["logprob"].get<double>());
    EXPECT_EQ(std::regex_replace(token_lines[i], piece, ""), want) << token_lines[i];
  }
  // 7 tokens of the tiny model's KV in one 16-token block: a few KiB, not "0.00 MiB".
  EXPECT_NE(text.out.find(" KiB peak"), std::string::npos) << text.out;
}

// A pool smaller than the model's context caps the context length at what it
// holds, and says so once at start-up; a large enough one says nothing.
TEST_F(BatonCli, SmallKvPoolWarnsOfTheContextItHolds) {
  const std::string args = "generate --model " + model().string() + " --prompt-ids 1,2,3";
  auto small = run(args + " --kv-cache-blocks 3 --block-size 16");
  ASSERT_EQ(small.exit_code, 0) << small.out;
  EXPECT_NE(small.out.find("context length 48 tokens, the KV pool's whole capacity, not 2048"),
            std::string::npos)
      << small.out;
  auto large = run(args + " --kv-cache-blocks 128 --block-size 16");
  ASSERT_EQ(large.exit_code, 0) << large.out;
  EXPECT_EQ(large.out.find("KV pool's whole capacity"), std::string::npos) << large.out;
}

TEST_F(BatonCli, HelpListsEveryEngineSetting) {
  auto help = run("generate --help");
  EXPECT_EQ(help.exit_code, 0) << help.out;
  const auto keys = baton::engine::engine_config_keys();
  ASSERT_GE(keys.size(), 13u);
  for (const std::string& key : keys) {
    EXPECT_NE(help.out.find("engine." + key), std::string::npos) << key;
    std::string flag = "--" + key;
    for (auto& c : flag) c = c == '_' ? '-' : c;
    EXPECT_NE(help.out.find(flag), std::string::npos) << flag;
  }
}

TEST_F(BatonCli, BadInputIsAClearErrorNotACrash) {
  std::ofstream(*dir_ / "scalar_engine.yaml") << "engine: 5\n";
  std::ofstream(*dir_ / "unknown_key.yaml") << "engine:\n  blok_size: 16\n";
  // More KV pool than any machine running the tests has.
  std::ofstream(*dir_ / "huge_pool.yaml") << "engine:\n  kv_cache_bytes: 512TiB\n";
  // A checkpoint whose generation_config.json never ends (/dev/zero).
  const std::filesystem::path endless = *dir_ / "endless";
  std::filesystem::create_directories(endless);
  for (const auto& entry : std::filesystem::directory_iterator(model()))
    if (entry.path().filename() != "generation_config.json")
      std::filesystem::copy(entry.path(), endless / entry.path().filename());
  std::filesystem::create_symlink("/dev/zero", endless / "generation_config.json");
  struct Case {
    std::string args;
    int exit_code;
    std::string message;
  } cases[] = {
      {"generate --model " + model().string() + " --prompt hi --threads 1 --config " +
           (*dir_ / "scalar_engine.yaml").string(),
       2, "engine: expected a mapping"},
      {"generate --model " + model().string() + " --prompt hi --config " +
           (*dir_ / "unknown_key.yaml").string(),
       2, "engine.blok_size: unknown key"},
      {"generate --model " + model().string() + " --prompt hi --config " +
           (*dir_ / "huge_pool.yaml").string(),
       2, "engine.kv_cache_bytes: a KV pool of "},
      {"generate --model " + model().string() + " --prompt-ids 1,x", 2, "'x' is not a token id"},
      {"generate --model " + model().string() + " --prompt-ids 1,2,", 2, "'' is not a token id"},
      {"generate --model " + model().string() + " --prompt-ids ,1", 2, "'' is not a token id"},
      {"generate --model " + model().string() + " --prompt-ids ''", 2,
       "--prompt-ids: no token ids"},
      {"generate --model " + model().string() + " --prompt ''", 2, "--prompt: the prompt is empty"},
      {"generate --model " + model().string() + " --prompt hi --stop-token-ids 3,", 2,
       "--stop-token-ids: '' is not a token id"},
      {"generate --model " + model().string() + " --prompt hi --stop-token-ids ''", 2,
       "--stop-token-ids: no token ids"},
      {"generate --model " + model().string() + " --prompt-ids 1,99999", 2,
       "outside the vocabulary"},
      {"generate --model " + model().string() + " --prompt hi --block-size 24", 2,
       "engine.block_size"},
      {"generate --model " + model().string(), 2, "give exactly one of"},
      {"generate --model " + model().string() + " --prompt hi --device gpu", 2,
       "engine.device: expected cpu, cuda or cuda:N, got 'gpu'"},
      {"generate --model " + (*dir_ / "missing").string() + " --prompt hi", 1, "missing"},
      {"make-model --preset nope --out " + (*dir_ / "x").string(), 2, "unknown model preset"},
      {"generate --model " + model().string() + " --prompt hi --temperature -1", 2, "temperature"},
      // Directories and endless files where files belong: named, not read.
      {"generate --model " + model().string() + " --prompt hi --config " + dir_->string(), 2,
       dir_->string() + ": is a directory, not a file"},
      {"up " + dir_->string(), 1, dir_->string() + ": is a directory, not a file"},
      {"generate --model " + endless.string() + " --prompt-ids 1,2", 2,
       "generation_config.json: not a regular file"},
  };
  for (const auto& c : cases) {
    auto r = run(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << r.out;
  }
}

// A router whose HTTP port another process holds says so and exits: a
// start that fails part-way stops only what it made (it used to crash).
TEST_F(BatonCli, ARouterWhosePortIsTakenSaysSoAndExits) {
  // A listening socket on a loopback port of the OS's choosing; closed at
  // once (the port then free) unless `keep`.
  auto port_of_a_socket = [](bool keep, int* fd) {
    *fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (*fd < 0 || ::bind(*fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(*fd, 1) != 0 ||
        ::getsockname(*fd, reinterpret_cast<sockaddr*>(&address), &length) != 0)
      return -1;
    if (!keep) ::close(*fd);
    return int(ntohs(address.sin_port));
  };
  int holder = -1, unused = -1;
  const int taken = port_of_a_socket(true, &holder);
  const int zmq = port_of_a_socket(false, &unused), control = port_of_a_socket(false, &unused);
  ASSERT_GT(taken, 0);
  ASSERT_GT(zmq, 0);
  ASSERT_GT(control, 0);
  const std::filesystem::path yaml = *dir_ / "taken-port.yaml";
  std::ofstream(yaml) << "model: {path: " << model().string() << "}\n"
                      << "router: {http_port: " << taken << ", zmq_port: " << zmq
                      << ", control_port: " << control << "}\n"
                      << "prefill: [{name: p}]\ndecode: [{name: d}]\n";
  auto r = run("router --config " + yaml.string());
  ::close(holder);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("cannot listen on 127.0.0.1:" + std::to_string(taken)), std::string::npos)
      << r.out;
}

// BATON_MAX_CPU_ISA caps the kernels, and the engine's log says which run;
// a value Baton does not know stops it at start, naming the variable,
// rather than running uncapped.
TEST_F(BatonCli, MaxCpuIsaCapsTheKernelsOrStopsAtStart) {
  const std::string args = "--log-level info generate --model " + model().string() +
                           " --prompt-ids 5,6,7 --max-tokens 2";
  struct Case {
    const char* cap;
    int exit_code;
    std::string message;
  } cases[] = {
      {"avx3", 2, "BATON_MAX_CPU_ISA='avx3': expected scalar, avx2, avx512 or amx"},
      {"AVX2", 2, "BATON_MAX_CPU_ISA='AVX2'"},
      {"scalar", 0, "CPU kernels scalar (capped by BATON_MAX_CPU_ISA)"},
      {"avx2", 0,
       baton::kernels::cpu::cpu_has_avx2_fma_f16c() ? "CPU kernels avx2 (capped"
                                                    : "CPU kernels scalar"},
      {"avx512", 0, "(capped by BATON_MAX_CPU_ISA)"},
  };
  for (const Case& c : cases) {
    ASSERT_EQ(::setenv("BATON_MAX_CPU_ISA", c.cap, 1), 0);
    auto r = run(args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.cap << "\n" << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.cap << "\n" << r.out;
    // Every cap below amx leaves the AMX tiles unused.
    if (c.exit_code == 0) {
      EXPECT_EQ(r.out.find("amx"), std::string::npos) << c.cap << "\n" << r.out;
    }
    // OpenBLAS is capped too (its kernels, as OpenBLAS names them): its
    // plainest under scalar; under avx2 where the CPU has AVX2, AVX2 kernels
    // without AVX-512 (Haswell's, or Zen's on AMD, which OpenBLAS picks there).
    if (c.exit_code == 0 && std::string(c.cap) != "avx512") {
      const bool scalar = std::string(c.cap) == "scalar";
      if (scalar) {
        EXPECT_NE(r.out.find("OpenBLAS kernels Prescott"), std::string::npos) << r.out;
      } else if (baton::kernels::cpu::cpu_has_avx2_fma_f16c()) {
        EXPECT_TRUE(r.out.find("OpenBLAS kernels Haswell") != std::string::npos ||
                    r.out.find("OpenBLAS kernels Zen") != std::string::npos)
            << c.cap << "\n"
            << r.out;
      }
    }
  }
  ASSERT_EQ(::unsetenv("BATON_MAX_CPU_ISA"), 0);
  auto uncapped = run(args);
  EXPECT_EQ(uncapped.exit_code, 0) << uncapped.out;
  EXPECT_NE(uncapped.out.find("CPU kernels " + baton::kernels::cpu::kernel_isa_name() + ";"),
            std::string::npos)
      << uncapped.out;
  EXPECT_EQ(uncapped.out.find("capped by"), std::string::npos) << uncapped.out;
}

// A checkpoint whose tokenizer.json Baton does not implement still serves
// token ids; text is refused, and the warning names what is missing.
TEST_F(BatonCli, AnUnsupportedTokenizerLeavesTokenIdsWorking) {
  const auto dir = *dir_ / "unigram";
  std::filesystem::create_directories(dir);
  for (const char* file : {"config.json", "model.safetensors"}) {
    std::filesystem::copy_file(model() / file, dir / file,
                               std::filesystem::copy_options::overwrite_existing);
  }
  std::ofstream(dir / "tokenizer.json") << R"({"model": {"type": "Unigram", "vocab": []}})";
  auto ids = run("generate --model " + dir.string() + " --prompt-ids 5,6,7 --max-tokens 3");
  EXPECT_EQ(ids.exit_code, 0) << ids.out;
  EXPECT_NE(ids.out.find("model type 'Unigram' is not supported"), std::string::npos) << ids.out;
  auto text = run("generate --model " + dir.string() + " --prompt hi --max-tokens 3");
  EXPECT_EQ(text.exit_code, 2) << text.out;
  EXPECT_NE(text.out.find("no tokenizer"), std::string::npos) << text.out;
}

// A device this machine does not have is refused at start, naming it,
// whether the build has the CUDA backend or not (no machine has 1000 GPUs).
TEST_F(BatonCli, AnAbsentDeviceIsRefusedAtStart) {
  auto r = run("generate --model " + model().string() + " --prompt hi --device cuda:999");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("cuda:999"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << r.out;
}

// `baton up` asks before it starts anything: a node on a device this host
// lacks is named with the device, instead of exiting and being restarted.
TEST_F(BatonCli, UpRefusesANodeOnAnAbsentDeviceNamingBoth) {
  const std::filesystem::path yaml = *dir_ / "absent-gpu.yaml";
  std::ofstream(yaml) << "model: {path: " << model().string() << "}\n"
                      << "router: {http_port: 1, zmq_port: 2, control_port: 3}\n"
                      << "engine: {device: 'cuda:999'}\n"
                      << "prefill: [{name: gpu-p}]\ndecode: [{name: gpu-d}]\n";
  auto r = run("up " + yaml.string());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("prefill node 'gpu-p': engine.device cuda:999: this "), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("router ready"), std::string::npos) << "started a role: " << r.out;
}

// Weights holding NaN make NaN logits: the output is meaningless, and the
// log says so (it used to be token 0, silently).
TEST_F(BatonCli, NonFiniteLogitsAreNamedInTheLog) {
  const std::filesystem::path spoiled = *dir_ / "nan-weights";
  std::filesystem::create_directories(spoiled);
  for (const auto& entry : std::filesystem::directory_iterator(model()))
    std::filesystem::copy(entry.path(), spoiled / entry.path().filename());
  // The final norm's F32 weights, overwritten with NaN in place.
  std::fstream file(spoiled / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header_bytes = 0;
  file.read(reinterpret_cast<char*>(&header_bytes), 8);
  std::string header(header_bytes, '\0');
  file.read(header.data(), std::streamsize(header_bytes));
  const auto norm = nlohmann::json::parse(header).at("model.norm.weight");
  ASSERT_EQ(norm.at("dtype"), "F32");
  const auto begin = norm.at("data_offsets")[0].get<uint64_t>();
  const auto end = norm.at("data_offsets")[1].get<uint64_t>();
  const std::vector<float> nans((end - begin) / 4, std::numeric_limits<float>::quiet_NaN());
  file.seekp(std::streamoff(8 + header_bytes + begin));
  file.write(reinterpret_cast<const char*>(nans.data()), std::streamsize(end - begin));
  file.close();

  auto r = run("generate --model " + spoiled.string() + " --prompt-ids 1,2,3 --max-tokens 3");
  EXPECT_NE(r.out.find("from a non-finite logit (nan)"), std::string::npos) << r.out;
  // Logged once for the run, not once a token.
  EXPECT_EQ(r.out.find("non-finite"), r.out.rfind("non-finite")) << r.out;
  auto healthy = run("generate --model " + model().string() + " --prompt-ids 1,2,3 --max-tokens 3");
  EXPECT_EQ(healthy.out.find("non-finite"), std::string::npos) << healthy.out;
}

// A bench over ZeroMQ against a port where no router listens says so in
// seconds, not after its request timeout (600 s by default).
TEST_F(BatonCli, BenchOverZeroMqToNoRouterSaysSoInSeconds) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  ::close(fd);  // the port, free now
  const auto start = std::chrono::steady_clock::now();
  auto r = run("bench --backend zmq --port " + std::to_string(ntohs(address.sin_port)) +
               " --model m --num-prompts 2");
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("within 10 s: is a router's zmq_port there?"), std::string::npos) << r.out;
  EXPECT_LT(took, std::chrono::seconds(30));
}

// A start-up that waits says for what, while it waits and when it gives up:
// here a router on another host (TEST-NET-1: nothing answers there).
TEST_F(BatonCli, UpSaysWhatItWaitsFor) {
  const std::filesystem::path yaml = *dir_ / "remote-router.yaml";
  std::ofstream(yaml) << "model: {path: " << model().string() << "}\n"
                      << "router: {host: 192.0.2.1, http_port: 18431, zmq_port: 18432, "
                         "control_port: 18433}\n"
                      << "prefill: [{name: p0, host: 127.0.0.1}]\n"
                      << "decode: [{name: d0, host: 127.0.0.1}]\n";
  auto r = run("up --ready-timeout 9 --max-restarts 0 " + yaml.string());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  const std::string waiting =
      "the router at http://192.0.2.1:18431 (not on this host) does not "
      "answer";
  // Reported once, 5 s in, or up to a look later (each look at the router
  // may wait 2 s for an answer where the address drops packets).
  const std::regex reported("waiting for the cluster \\([5-7]s of 9s\\): ");
  std::smatch at;
  ASSERT_TRUE(std::regex_search(r.out, at, reported)) << r.out;
  EXPECT_EQ(r.out.compare(size_t(at.position(0) + at.length(0)), waiting.size(), waiting), 0)
      << r.out;
  EXPECT_NE(r.out.find("the cluster was not ready after 9 s: " + waiting), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("Baton is up"), std::string::npos) << r.out;
}

// Nodes `baton up` starts here share this host's memory whatever name or
// address of it their YAML gives: their memory fractions adding up to more
// than all of it are refused before anything starts, naming them.
TEST_F(BatonCli, UpRefusesMemorySharesOfThisHostAddingUpToMoreThanIt) {
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof(name) - 1), 0);
  const std::filesystem::path yaml = *dir_ / "shares.yaml";
  std::ofstream(yaml) << "model: {path: " << model().string() << "}\n"
                      << "router: {http_port: 18441, zmq_port: 18442, control_port: 18443}\n"
                      << "prefill: [{name: p0, host: '" << name
                      << "', engine: {memory_fraction: 0.6}}]\n"
                      << "decode: [{name: d0, host: 127.0.0.1, engine: {memory_fraction: 0.5}}]\n";
  auto r = run("up --ready-timeout 9 --max-restarts 0 " + yaml.string());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("decode[0].engine.memory_fraction: p0, d0 share cpu on this host and ask "
                       "for 0.6 + 0.5 of its memory"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("Baton is up"), std::string::npos) << r.out;
}

}  // namespace

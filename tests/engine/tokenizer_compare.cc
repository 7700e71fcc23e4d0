// tests/engine/tokenizer_compare.cc — runs a checkpoint directory's tokenizer
// over a corpus for hf_tokenizer_test.py, which holds the output against
// Hugging Face's `tokenizers`. Reads one JSON string per line; writes one
// JSON object per line: {"ids": [...], "text": decode(ids), "split": k,
// "streamed": ..., "whole": ...}: the ids from k on read as a generation's
// output after the prompt ids[0, k), once streamed in random chunks as the
// router reads them (router/incremental_text.h) and once whole.
//
//   tokenizer_compare DIR CORPUS.jsonl > OUT.jsonl
//   tokenizer_compare --bench DIR CORPUS.jsonl    (encode MB/s, one thread)
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/tokenizer.h"
#include "router/incremental_text.h"

namespace {

// The router's reading of output tokens after a prompt: chunks of 1 to 4
// tokens, or all of them at once.
std::string read_output(const std::vector<int32_t>& ids, size_t split,
                        const baton::router::DecodeFn& decode, std::mt19937* rng) {
  const size_t lead = std::min(split, baton::router::kDetokenizeContextTokens);
  const std::vector<int32_t> prompt(ids.begin() + long(split - lead), ids.begin() + long(split));
  std::vector<int32_t> output;
  size_t decoded = 0;
  std::string text;
  for (size_t i = split; i < ids.size();) {
    const size_t n = rng != nullptr ? 1 + (*rng)() % 4 : ids.size() - split;
    for (size_t k = 0; k < n && i < ids.size(); ++k) output.push_back(ids[i++]);
    baton::router::append_decoded(output, decoded, text, decode, prompt);
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  const bool bench = argc == 4 && std::string(argv[1]) == "--bench";
  if (bench) ++argv;
  if (argc != 3 && !bench) {
    std::fprintf(stderr, "usage: tokenizer_compare [--bench] DIR CORPUS.jsonl\n");
    return 2;
  }
  auto tokenizer = baton::engine::load_tokenizer(argv[1]);
  if (!tokenizer.is_ok()) {
    std::fprintf(stderr, "%s\n", tokenizer.status().to_string().c_str());
    return 1;
  }
  std::ifstream in(argv[2], std::ios::binary);
  std::string line;
  if (bench) {
    std::vector<std::string> lines;
    size_t bytes = 0;
    while (std::getline(in, line)) {
      lines.push_back(nlohmann::json::parse(line).get<std::string>());
      bytes += lines.back().size();
    }
    size_t tokens = 0, rounds = 0;
    const auto start = std::chrono::steady_clock::now();
    double seconds = 0;
    do {
      for (const auto& text : lines) tokens += (*tokenizer)->encode(text).size();
      ++rounds;
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } while (seconds < 2.0);
    std::printf("%.2f MB/s (%zu rounds of %zu bytes, %zu tokens)\n",
                double(bytes) * double(rounds) / seconds / 1e6, rounds, bytes, tokens / rounds);
    return 0;
  }
  std::mt19937 rng(std::random_device{}());
  const baton::router::DecodeFn decode = [&](const std::vector<int32_t>& ids) {
    return (*tokenizer)->decode(ids);
  };
  while (std::getline(in, line)) {
    const std::string text = nlohmann::json::parse(line).get<std::string>();
    const auto ids = (*tokenizer)->encode(text);
    const size_t split = ids.size() / 3;
    nlohmann::json out = {{"ids", ids},
                          {"text", (*tokenizer)->decode(ids)},
                          {"split", split},
                          {"streamed", read_output(ids, split, decode, &rng)},
                          {"whole", read_output(ids, split, decode, nullptr)}};
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}

// tests/engine/tokenizer_compare.cc — runs a checkpoint directory's tokenizer
// over a corpus for hf_tokenizer_test.py, which holds the output against
// Hugging Face's `tokenizers`. Reads one JSON string per line; writes one
// JSON object per line: {"ids": [...], "text": decode(ids)}.
//
//   tokenizer_compare DIR CORPUS.jsonl > OUT.jsonl
//   tokenizer_compare --bench DIR CORPUS.jsonl    (encode MB/s, one thread)
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/tokenizer.h"

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
  while (std::getline(in, line)) {
    const std::string text = nlohmann::json::parse(line).get<std::string>();
    const auto ids = (*tokenizer)->encode(text);
    nlohmann::json out = {{"ids", ids}, {"text", (*tokenizer)->decode(ids)}};
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}

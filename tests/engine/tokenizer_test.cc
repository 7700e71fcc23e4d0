#include "engine/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>

#include "tests/engine/temp_model.h"

namespace baton::engine {
namespace {

TEST(ByteTokenizer, RoundTripsArbitraryBytes) {
  std::mt19937 rng(std::random_device{}());
  ByteTokenizer tok;
  for (int i = 0; i < 50; ++i) {
    std::string text(rng() % 64, '\0');
    for (auto& c : text) c = char(rng() & 0xff);
    auto ids = tok.encode(text);
    ASSERT_EQ(ids.size(), text.size());
    for (int32_t id : ids) ASSERT_GE(id, ByteTokenizer::kByteOffset);
    EXPECT_EQ(tok.decode(ids), text);
  }
  EXPECT_EQ(tok.decode({ByteTokenizer::kBosId, 'h' + 3, ByteTokenizer::kEosId, 100000}),
            "h<|100000|>");
}

TEST(ByteTokenizer, EncodeUpToStopsOneBytePastTheLimit) {
  std::mt19937 rng(std::random_device{}());
  ByteTokenizer tok;
  for (int i = 0; i < 50; ++i) {
    std::string text(rng() % 64, '\0');
    for (auto& c : text) c = char(rng() & 0xff);
    const size_t limit = rng() % 80;
    const std::vector<int32_t> whole = tok.encode(text);
    const std::vector<int32_t> part = tok.encode_up_to(text, limit);
    if (whole.size() <= limit) {
      EXPECT_EQ(part, whole);
    } else {
      ASSERT_EQ(part.size(), limit + 1);
      EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin()));
    }
  }
}

TEST(ByteTokenizer, SavesAndLoads) {
  testing::TempDir dir;
  EXPECT_EQ(load_tokenizer(dir.path()).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(ByteTokenizer::save(dir.path()).is_ok());
  auto tok = load_tokenizer(dir.path());
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->decode((*tok)->encode("Baton")), "Baton");

  std::ofstream(dir.path() / kByteTokenizerFile) << "{\"type\": \"byte\", \"bos";
  auto broken = load_tokenizer(dir.path());
  EXPECT_EQ(broken.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(broken.status().message().find(kByteTokenizerFile), std::string::npos);
}

}  // namespace
}  // namespace baton::engine

#include "engine/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <optional>
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

TEST(ByteTokenizer, EncodeWithinGivesTheWholeEncodingOrNothingPastTheLimit) {
  std::mt19937 rng(std::random_device{}());
  ByteTokenizer tok;
  for (int i = 0; i < 50; ++i) {
    std::string text(rng() % 64, '\0');
    for (auto& c : text) c = char(rng() & 0xff);
    const size_t limit = rng() % 80;
    const std::optional<std::vector<int32_t>> part = tok.encode_within(text, limit);
    ASSERT_EQ(part.has_value(), text.size() <= limit) << text.size() << " bytes, limit " << limit;
    if (part) {
      EXPECT_EQ(*part, tok.encode(text));
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

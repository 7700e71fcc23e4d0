// tokenizer.json loading and the BPE pipeline on small hand-made vocabularies:
// merge order, ignore_merges, added tokens, BOS/EOS, byte round trips, and
// every refusal naming what it refuses. Real vocabularies against Hugging
// Face's `tokenizers` are hf_tokenizer_test.py's.
#include "engine/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "tests/engine/temp_model.h"

namespace baton::engine {
namespace {

using nlohmann::json;

// GPT-2's byte alphabet: the printable bytes stand for themselves; the rest
// map to U+0100 upwards in byte order.
std::string byte_char(int b) {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    for (int c = 0; c < 256; ++c) {
      const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
      const int cp = printable ? c : next++;
      std::string s;
      if (cp < 0x80) {
        s.push_back(char(cp));
      } else {
        s.push_back(char(0xC0 | (cp >> 6)));
        s.push_back(char(0x80 | (cp & 0x3F)));
      }
      t[size_t(c)] = s;
    }
    return t;
  }();
  return table[size_t(b)];
}

// Bytes 0-255 as ids 0-255, then `extra` tokens; `merges` in rank order.
json byte_level_bpe(const std::vector<std::string>& extra, const std::vector<std::string>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  int next = 256;
  for (const auto& t : extra) vocab[t] = next++;
  return {
      {"version", "1.0"},
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}}};
}

class HfTokenizerTest : public ::testing::Test {
 protected:
  Result<std::unique_ptr<Tokenizer>> load(const json& doc, const json& config = nullptr) {
    std::ofstream(dir_.path() / "tokenizer.json") << doc.dump();
    if (!config.is_null()) std::ofstream(dir_.path() / "tokenizer_config.json") << config.dump();
    return load_tokenizer(dir_.path());
  }
  testing::TempDir dir_;
};

TEST_F(HfTokenizerTest, MergesApplyLowestRankFirst) {
  // "th" outranks nothing here: "h e" (rank 0) merges before "t h" (rank 1),
  // so "the" is t + he, then the + nothing.
  auto tok = load(byte_level_bpe({"he", "th", "the"}, {"h e", "t h", "t he"}));
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->encode("the"), (std::vector<int32_t>{258}));
  EXPECT_EQ((*tok)->encode("th"), (std::vector<int32_t>{257}));
  // Without "t he", "the" stops at t + he: "th" never forms.
  auto short_merges = load(byte_level_bpe({"he", "th", "the"}, {"h e", "t h"}));
  ASSERT_TRUE(short_merges.is_ok());
  EXPECT_EQ((*short_merges)->encode("the"), (std::vector<int32_t>{'t', 256}));
  // GPT-2's regex splits " the" off as a word of its own: Ġ (byte 32) then
  // "the", since no merge takes the space.
  EXPECT_EQ((*tok)->encode("the the"), (std::vector<int32_t>{258, ' ', 258}));
}

TEST_F(HfTokenizerTest, IgnoreMergesTakesAWholeWordTheVocabularyHolds) {
  json doc = byte_level_bpe({"ab", "abc"}, {"a b"});
  auto without = load(doc);
  ASSERT_TRUE(without.is_ok());
  EXPECT_EQ((*without)->encode("abc"), (std::vector<int32_t>{256, 'c'}));
  doc["model"]["ignore_merges"] = true;
  auto with = load(doc);
  ASSERT_TRUE(with.is_ok());
  EXPECT_EQ((*with)->encode("abc"), (std::vector<int32_t>{257}));
}

TEST_F(HfTokenizerTest, ArbitraryBytesRoundTrip) {
  auto tok = load(byte_level_bpe({"he"}, {"h e"}));
  ASSERT_TRUE(tok.is_ok());
  std::mt19937 rng(std::random_device{}());
  for (int i = 0; i < 200; ++i) {
    std::string text(rng() % 48, '\0');
    for (auto& c : text) c = char(rng() & 0xff);  // invalid UTF-8 included
    EXPECT_EQ((*tok)->decode((*tok)->encode(text)), text);
  }
}

// SentencePiece-style (Llama 2): "▁" for spaces, unknown characters as their
// UTF-8 bytes' <0xXX> tokens, one leading space stripped on decode. Bytes
// that are not UTF-8 come back as they went in.
TEST_F(HfTokenizerTest, ByteFallbackRoundTripsArbitraryBytes) {
  json vocab = {{"<unk>", 0},    {"<s>", 1}, {"</s>", 2},
                {"\u2581", 259}, {"a", 260}, {"\u2581a", 261}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  json doc = {{"normalizer",
               {{"type", "Sequence"},
                {"normalizers",
                 {{{"type", "Prepend"}, {"prepend", "\u2581"}},
                  {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}}},
              {"pre_tokenizer", nullptr},
              {"decoder",
               {{"type", "Sequence"},
                {"decoders",
                 {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                  {{"type", "ByteFallback"}},
                  {{"type", "Fuse"}},
                  {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
              {"model",
               {{"type", "BPE"},
                {"unk_token", "<unk>"},
                {"byte_fallback", true},
                {"fuse_unk", true},
                {"vocab", vocab},
                {"merges", {"\u2581 a"}}}}};
  auto tok = load(doc);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->encode("a a"), (std::vector<int32_t>{261, 261}));
  EXPECT_EQ((*tok)->encode("\xc3\xa9"), (std::vector<int32_t>{259, 3 + 0xC3, 3 + 0xA9}));
  std::mt19937 rng(std::random_device{}());
  for (int i = 0; i < 200; ++i) {
    std::string text(rng() % 48, '\0');
    for (auto& c : text) c = char(rng() & 0xff);
    if (text.find("\u2581") != std::string::npos) continue;  // would decode as a space
    EXPECT_EQ((*tok)->decode((*tok)->encode(text)), text);
  }
}

TEST_F(HfTokenizerTest, AddedTokensSplitTheTextAndSpecialOnesDecodeToNothing) {
  json doc = byte_level_bpe({}, {});
  doc["added_tokens"] = {{{"id", 300},
                          {"content", "<|eot|>"},
                          {"special", true},
                          {"lstrip", false},
                          {"rstrip", true},
                          {"single_word", false},
                          {"normalized", false}},
                         {{"id", 301},
                          {"content", "<|eot|>x"},
                          {"special", false},
                          {"lstrip", true},
                          {"rstrip", false},
                          {"single_word", false},
                          {"normalized", false}}};
  auto tok = load(doc);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  // Longest match wins; rstrip eats the spaces after the special token.
  EXPECT_EQ((*tok)->encode("a<|eot|>  b"), (std::vector<int32_t>{'a', 300, 'b'}));
  EXPECT_EQ((*tok)->encode("a  <|eot|>x"), (std::vector<int32_t>{'a', 301}));
  EXPECT_EQ((*tok)->decode({'a', 300, 'b', 301}), "ab<|eot|>x");
}

// encode_within gives the whole encoding while it fits the limit, and
// nothing past it: whether the text crossed it at a word, at an added token
// or inside one long word that is never merged.
TEST_F(HfTokenizerTest, EncodeWithinGivesTheWholeEncodingOrNothingPastTheLimit) {
  json doc = byte_level_bpe({"he", "the", "ll", "llo"}, {"h e", "t he", "l l", "ll o"});
  doc["added_tokens"] = {{{"id", 300},
                          {"content", "<|eot|>"},
                          {"special", true},
                          {"lstrip", false},
                          {"rstrip", false},
                          {"single_word", false},
                          {"normalized", false}}};
  auto tok = load(doc);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const std::string long_word(2000 + std::random_device{}() % 2000, 'q');
  const std::string words[] = {"the ", "hello ", "<|eot|>", "x\n", "\xc3\xa9 ", long_word};
  std::mt19937 rng(std::random_device{}());
  int fit = 0, over = 0;
  for (int round = 0; round < 300; ++round) {
    std::string text;
    for (size_t n = rng() % 400; n > 0; --n)
      text += words[rng() % (std::size(words) - (rng() % 8 != 0))];
    const std::vector<int32_t> whole = (*tok)->encode(text);
    // At the boundary (just fitting, one short), or anywhere below or above.
    const size_t n = whole.size();
    const size_t choices[] = {n, n > 0 ? n - 1 : 0, rng() % (n + 1), n + rng() % 8};
    const size_t limit = choices[rng() % 4];
    const std::optional<std::vector<int32_t>> part = (*tok)->encode_within(text, limit);
    if (whole.size() <= limit) {
      ASSERT_TRUE(part.has_value()) << "limit " << limit << " of " << whole.size();
      EXPECT_EQ(*part, whole);
      ++fit;
    } else {
      EXPECT_FALSE(part.has_value()) << "limit " << limit << " of " << whole.size();
      ++over;
    }
  }
  EXPECT_GT(fit, 50);
  EXPECT_GT(over, 50);
}

// Where unknown characters fuse into one unk_token a long word may be one id:
// its length shows nothing, so it is encoded and fits.
TEST_F(HfTokenizerTest, EncodeWithinCountsAFusedUnknownRunAsTheOneIdItIs) {
  json doc = {{"normalizer", nullptr},
              {"pre_tokenizer",
               {{"type", "Split"},
                {"pattern", {{"String", " "}}},
                {"behavior", "Removed"},
                {"invert", false}}},
              {"decoder", {{"type", "Fuse"}}},
              {"model",
               {{"type", "BPE"},
                {"unk_token", "<unk>"},
                {"byte_fallback", false},
                {"fuse_unk", true},
                {"vocab", {{"<unk>", 0}, {"a", 1}}},
                {"merges", json::array()}}}};
  auto tok = load(doc);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const std::string run(1000 + std::random_device{}() % 1000, 'z');
  EXPECT_EQ((*tok)->encode("a " + run), (std::vector<int32_t>{1, 0}));
  const auto within = (*tok)->encode_within("a " + run, 2);
  ASSERT_TRUE(within.has_value());
  EXPECT_EQ(*within, (std::vector<int32_t>{1, 0}));
  EXPECT_FALSE((*tok)->encode_within("a " + run + " a", 2).has_value());
}

TEST_F(HfTokenizerTest, BosFromTheTemplateAndEosFromTheConfig) {
  json doc = byte_level_bpe({}, {});
  doc["added_tokens"] = {{{"id", 400}, {"content", "<s>"}, {"special", true}},
                         {{"id", 401}, {"content", "</s>"}, {"special", true}}};
  auto plain = load(doc);
  ASSERT_TRUE(plain.is_ok());
  EXPECT_EQ((*plain)->bos_id(), -1);
  EXPECT_EQ((*plain)->eos_id(), -1);
  doc["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single",
                            {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}};
  auto tok = load(doc, {{"eos_token", {{"content", "</s>"}}}});
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->bos_id(), 400);
  EXPECT_EQ((*tok)->eos_id(), 401);
  EXPECT_EQ((*tok)->encode("<s>a"), (std::vector<int32_t>{400, 'a'}));  // no BOS added by encode
}

TEST_F(HfTokenizerTest, RefusesWhatItDoesNotImplementNamingIt) {
  const json base = byte_level_bpe({"he"}, {"h e"});
  struct Case {
    std::function<void(json&)> change;
    StatusCode code;
    std::string says;
  } cases[] = {
      {[](json& d) {
         d["normalizer"] = {{"type", "NFKD"}};
       },
       StatusCode::kUnimplemented, "normalizer 'NFKD'"},
      {[](json& d) {
         d["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       StatusCode::kUnimplemented, "pre_tokenizer 'Whitespace'"},
      {[](json& d) {
         d["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "_"}};
       },
       StatusCode::kUnimplemented, "normalizer Replace with a Regex pattern"},
      {[](json& d) { d["model"]["type"] = "WordPiece"; }, StatusCode::kUnimplemented,
       "model type 'WordPiece'"},
      {[](json& d) { d["model"]["unk_token"] = "<nope>"; }, StatusCode::kDataLoss,
       "unk_token '<nope>'"},
      {[](json& d) {
         d["decoder"] = {{"type", "WordPiece"}};
       },
       StatusCode::kUnimplemented, "decoder 'WordPiece'"},
      {[](json& d) { d["decoder"] = nullptr; }, StatusCode::kUnimplemented, "without a decoder"},
      {[](json& d) {
         d["pre_tokenizer"] = {{"type", "Split"},
                               {"pattern", {{"Regex", "\\s+"}}},
                               {"behavior", "MergedWithPrevious"},
                               {"invert", false}};
       },
       StatusCode::kUnimplemented, "behavior 'MergedWithPrevious'"},
      {[](json& d) {
         d["pre_tokenizer"] = {{"type", "Split"},
                               {"pattern", {{"Regex", "(unclosed"}}},
                               {"behavior", "Isolated"},
                               {"invert", false}};
       },
       StatusCode::kInvalidArgument, "(unclosed"},
      {[](json& d) { d["model"]["merges"] = {"h x"}; }, StatusCode::kDataLoss,
       "merge 0 ('h', 'x')"},
      {[](json& d) { d["model"]["merges"] = {"he"}; }, StatusCode::kDataLoss, "is not 'a b'"},
      {[](json& d) { d["model"]["vocab"].erase(byte_char(200)); }, StatusCode::kUnimplemented,
       "lacks the byte character"},
      {[](json& d) { d["model"]["vocab"]["he"] = "x"; }, StatusCode::kDataLoss,
       "vocab['he'] is not a token id"},
      {[](json& d) {
         d["post_processor"] = {{"type", "RobertaProcessing"}};
       },
       StatusCode::kUnimplemented, "post_processor 'RobertaProcessing'"},
      {[](json& d) {
         d["added_tokens"] = json::array({json{{"id", 7}}});
       },
       StatusCode::kDataLoss, "added token lacks"},
      {[](json& d) { d["model"]["vocab"] = 5; }, StatusCode::kDataLoss, "model.vocab"},
      // A field of the wrong type names the section it is in, without
      // nlohmann's exception id.
      {[](json& d) { d["model"]["type"] = 5; }, StatusCode::kDataLoss,
       "tokenizer.json: model: type must be string, but is number"},
      {[](json& d) {
         d["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", "yes"}};
       },
       StatusCode::kDataLoss, "tokenizer.json: pre_tokenizer: type must be boolean"},
      {[](json& d) {
         d["added_tokens"] = json::array({json{{"id", 9}, {"content", "x"}, {"special", 1}}});
       },
       StatusCode::kDataLoss, "added_tokens or post_processor: type must be boolean"},
      // An id past 2^32 that would narrow to 5, a valid id.
      {[](json& d) {
         d["added_tokens"] = json::array({json{{"id", (int64_t(1) << 32) + 5}, {"content", "x"}}});
       },
       StatusCode::kDataLoss, "added token id 4294967301 out of range"},
      // A Strip count as a huge float (casting it to int was undefined), a
      // negative one, one past any token.
      {[](json& d) {
         d["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", 1.7e127}, {"stop", 0}};
       },
       StatusCode::kDataLoss, "decoder Strip start must be a count"},
      {[](json& d) {
         d["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", 0}, {"stop", -1}};
       },
       StatusCode::kDataLoss, "decoder Strip stop must be a count"},
      {[](json& d) {
         d["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", uint64_t(1) << 40}};
       },
       StatusCode::kDataLoss, "decoder Strip start must be a count"},
  };
  for (const auto& c : cases) {
    json doc = base;
    c.change(doc);
    auto tok = load(doc);
    ASSERT_FALSE(tok.is_ok()) << c.says;
    EXPECT_EQ(tok.status().code(), c.code) << tok.status().to_string();
    EXPECT_NE(tok.status().message().find(c.says), std::string::npos) << tok.status().to_string();
    EXPECT_NE(tok.status().message().find("tokenizer.json"), std::string::npos)
        << tok.status().to_string();
  }
  // Truncated and non-JSON files.
  const std::string text = base.dump();
  for (const std::string& broken :
       {text.substr(0, text.size() / 2), std::string("[1, 2]"), std::string("")}) {
    std::ofstream(dir_.path() / "tokenizer.json") << broken;
    auto tok = load_tokenizer(dir_.path());
    ASSERT_FALSE(tok.is_ok());
    EXPECT_NE(tok.status().message().find("tokenizer.json"), std::string::npos)
        << tok.status().to_string();
  }
}

}  // namespace
}  // namespace baton::engine

namespace baton::engine {
namespace {

void collect_paths(const json& node, const json::json_pointer& at,
                   std::vector<json::json_pointer>& out) {
  out.push_back(at);
  if (node.is_object()) {
    for (const auto& [key, child] : node.items()) collect_paths(child, at / key, out);
  } else if (node.is_array()) {
    for (size_t i = 0; i < node.size(); ++i) collect_paths(node[i], at / i, out);
  }
}

// A tokenizer.json with every kind of part, damaged at random places (a key
// dropped, a value of the wrong type or range, a truncated string): loading
// gives a tokenizer or an error naming the file, and a tokenizer that loads
// encodes and decodes arbitrary bytes. Run under ASan, this is the loader's
// fuzz test.
TEST_F(HfTokenizerTest, DamagedFilesLoadOrFailNamingTheFileAndNeverCrash) {
  json base = byte_level_bpe({"he", "ll", "hell", "<|s|>", "<|e|>"}, {"h e", "l l", "he ll"});
  base["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "NFC"}},
        {{"type", "Replace"}, {"pattern", {{"String", "\t"}}}, {"content", " "}}}}};
  base["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", "\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+|\\s+"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  base["added_tokens"] = {{{"id", 259},
                           {"content", "<|s|>"},
                           {"special", true},
                           {"lstrip", false},
                           {"rstrip", true},
                           {"single_word", false},
                           {"normalized", false}},
                          {{"id", 260},
                           {"content", "<|e|>"},
                           {"special", true},
                           {"lstrip", true},
                           {"rstrip", false},
                           {"single_word", false},
                           {"normalized", false}}};
  base["post_processor"] = {{"type", "TemplateProcessing"},
                            {"single",
                             {{{"SpecialToken", {{"id", "<|s|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                            {"special_tokens", {{"<|s|>", {{"id", "<|s|>"}, {"ids", {259}}}}}}};
  ASSERT_TRUE(load(base).is_ok()) << load(base).status().to_string();

  std::vector<json::json_pointer> paths;
  collect_paths(base, json::json_pointer(), paths);
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  const json replacements[] = {
      nullptr, -1, int64_t(1) << 40, 3.5, "", "x", "(", json::array(), json::object(), true};
  int loaded = 0;
  for (int round = 0; round < 400; ++round) {
    json doc = base;
    for (int edits = 1 + int(rng() % 3); edits > 0; --edits) {
      const json::json_pointer& at = paths[rng() % paths.size()];
      if (at.empty() || !doc.contains(at)) continue;
      json& node = doc[at];
      switch (rng() % 3) {
        case 0:
          doc[at.parent_pointer()].erase(doc[at.parent_pointer()].is_object()
                                             ? doc[at.parent_pointer()].find(at.back())
                                             : doc[at.parent_pointer()].end());
          break;
        case 1:
          node = replacements[rng() % std::size(replacements)];
          break;
        default:
          if (node.is_string()) node = node.get<std::string>().substr(0, rng() % 3);
      }
    }
    auto tok = load(doc);
    if (!tok.is_ok()) {
      EXPECT_NE(tok.status().message().find("tokenizer"), std::string::npos)
          << "seed " << seed << ": " << tok.status().to_string();
      continue;
    }
    ++loaded;
    for (int i = 0; i < 4; ++i) {
      std::string text(rng() % 40, '\0');
      for (auto& c : text) c = char(rng() & 0xff);
      const std::vector<int32_t> ids = (*tok)->encode(text + "<|s|>hello<|e|>");
      for (int32_t id : ids) EXPECT_LT(id, (*tok)->vocab_size()) << "seed " << seed;
      (void)(*tok)->decode(ids);
    }
  }
  // Some damage is harmless (a flag dropped, a string shortened): the
  // loader was exercised past its checks too.
  EXPECT_GT(loaded, 0) << "seed " << seed;
  // Sequences nested 100,000 deep in each component: refused as the file
  // is read, naming it, not a stack exhausted by a copy or a walk.
  for (const auto& [component, list] : {std::pair{"normalizer", "normalizers"},
                                        {"pre_tokenizer", "pretokenizers"},
                                        {"decoder", "decoders"}}) {
    // Written as text: nlohmann's own dump recurses as deep.
    json deep = base;
    deep[component] = "NESTED";
    std::string text = deep.dump();
    std::string nested;
    const std::string open = std::string(R"({"type":"Sequence",")") + list + R"(":[)";
    for (int level = 0; level < 100000; ++level) nested += open;
    for (int level = 0; level < 100000; ++level) nested += "]}";
    text.replace(text.find(R"("NESTED")"), 8, nested);
    std::ofstream(dir_.path() / "tokenizer.json") << text;
    auto tok = load_tokenizer(dir_.path());
    ASSERT_FALSE(tok.is_ok()) << component;
    EXPECT_NE(tok.status().message().find("tokenizer.json: nests lists and objects deeper than"),
              std::string::npos)
        << tok.status().to_string();
  }
  // Bytes cut off anywhere: never a crash.
  const std::string text = base.dump();
  for (int round = 0; round < 100; ++round) {
    std::ofstream(dir_.path() / "tokenizer.json") << text.substr(0, rng() % text.size());
    auto tok = load_tokenizer(dir_.path());
    EXPECT_FALSE(tok.is_ok()) << "seed " << seed;
  }
}

}  // namespace
}  // namespace baton::engine

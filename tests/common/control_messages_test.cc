// Round trips and hostile frames for the control-plane codec.
#include "common/control_messages.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

// The cases build messages with designated initializers that name only the
// fields a case is about; the others keep their defaults, as intended.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace baton::control {
namespace {

using json = nlohmann::json;

std::vector<int32_t> random_ints(std::mt19937_64& rng, size_t n, int32_t max) {
  std::vector<int32_t> out(n);
  for (int32_t& v : out) v = int32_t(rng() % uint64_t(max));
  return out;
}

SamplingSpec random_sampling(std::mt19937_64& rng) {
  SamplingSpec s;
  s.temperature = float(rng() % 200) / 100.0f;
  s.top_p = float(1 + rng() % 100) / 100.0f;
  s.top_k = int32_t(rng() % 50);
  s.seed = rng();
  s.max_tokens = int32_t(1 + rng() % 4096);
  s.stop_token_ids = random_ints(rng, rng() % 4, 50000);
  s.ignore_eos = rng() % 2;
  if (rng() % 2) {  // the extras, or their defaults (left out of the frame)
    s.min_p = float(rng() % 100) / 100.0f;
    s.presence_penalty = float(int(rng() % 400) - 200) / 100.0f;
    s.frequency_penalty = float(int(rng() % 400) - 200) / 100.0f;
    s.repetition_penalty = float(1 + rng() % 300) / 100.0f;
    s.min_tokens = int32_t(rng() % 100);
    s.prompt_logprobs = int32_t(rng() % 6);
    s.logit_bias_ids = random_ints(rng, rng() % 5, 50000);
    for (size_t i = 0; i < s.logit_bias_ids.size(); ++i) {
      s.logit_bias_values.push_back(float(int(rng() % 200) - 100));
    }
  }
  return s;
}

void expect_equal(const SamplingSpec& a, const SamplingSpec& b) {
  EXPECT_EQ(a.temperature, b.temperature);
  EXPECT_EQ(a.top_p, b.top_p);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.max_tokens, b.max_tokens);
  EXPECT_EQ(a.stop_token_ids, b.stop_token_ids);
  EXPECT_EQ(a.ignore_eos, b.ignore_eos);
  EXPECT_EQ(a.min_p, b.min_p);
  EXPECT_EQ(a.presence_penalty, b.presence_penalty);
  EXPECT_EQ(a.frequency_penalty, b.frequency_penalty);
  EXPECT_EQ(a.repetition_penalty, b.repetition_penalty);
  EXPECT_EQ(a.min_tokens, b.min_tokens);
  EXPECT_EQ(a.prompt_logprobs, b.prompt_logprobs);
  EXPECT_EQ(a.logit_bias_ids, b.logit_bias_ids);
  EXPECT_EQ(a.logit_bias_values, b.logit_bias_values);
}

template <typename T>
T round_trip(const T& message) {
  std::vector<uint8_t> frame = encode(Message(message));
  Result<Message> decoded = decode(frame);
  EXPECT_TRUE(decoded.is_ok()) << decoded.status().to_string();
  EXPECT_TRUE(std::holds_alternative<T>(*decoded));
  return std::get<T>(std::move(decoded).value());
}

TEST(ControlMessages, EveryTypeRoundTrips) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<uint8_t> descriptor(100 + rng() % 300);
  for (uint8_t& b : descriptor) b = uint8_t(rng());

  Register reg{"decode-" + std::to_string(rng() % 9),
               Role::kDecode,
               descriptor,
               16,
               2048,
               int64_t(rng() % 100000),
               "fp8_e4m3",
               int64_t(rng() % 100000),
               "cuda:" + std::to_string(rng() % 8),
               "cuda device 0 through 512 pinned host slots (1.0 GiB)",
               int64_t(rng() % (uint64_t(1) << 40)),
               int64_t(rng() % (uint64_t(1) << 40))};
  Register reg2 = round_trip(reg);
  EXPECT_EQ(reg2.node, reg.node);
  EXPECT_EQ(reg2.role, reg.role);
  EXPECT_EQ(reg2.descriptor, reg.descriptor);
  EXPECT_EQ(reg2.block_size, 16);
  EXPECT_EQ(reg2.max_model_len, 2048);
  EXPECT_EQ(reg2.pid, reg.pid);
  EXPECT_EQ(reg2.kv_dtype, "fp8_e4m3");
  EXPECT_EQ(reg2.kv_bytes_per_token, reg.kv_bytes_per_token);
  EXPECT_EQ(reg2.device, reg.device);
  EXPECT_EQ(reg2.kv_staging, reg.kv_staging);
  EXPECT_EQ(reg2.weights_bytes, reg.weights_bytes);
  EXPECT_EQ(reg2.kv_pool_bytes, reg.kv_pool_bytes);
  EXPECT_TRUE(reg2.prefix_caching);  // absent on the wire: on
  reg.prefix_caching = false;
  EXPECT_FALSE(round_trip(reg).prefix_caching);

  EXPECT_EQ(round_trip(RegisterAck{true, "welcome"}).message, "welcome");
  EXPECT_EQ(round_trip(RegisterAck{true, "welcome"}).registration, 0u);  // absent: none
  const uint64_t registration = rng() | 1;
  EXPECT_EQ(round_trip(RegisterAck{false, "again", registration}).registration, registration);

  Heartbeat hb{"prefill-1", {}};
  hb.load.running = int32_t(rng() % 100);
  hb.load.waiting_tokens = int64_t(rng() % (1ull << 40));
  hb.load.free_blocks = 17;
  hb.load.total_blocks = 99;
  hb.load.messages_rejected = 3;
  hb.load.prefix_cache_hits = 48;
  hb.load.prefix_cache_ssd_hits = 32;
  EXPECT_EQ(round_trip(hb).registration, 0u);
  hb.registration = rng() | 1;
  Heartbeat hb2 = round_trip(hb);
  EXPECT_EQ(hb2.node, hb.node);
  EXPECT_EQ(hb2.registration, hb.registration);
  EXPECT_EQ(hb2.load.running, hb.load.running);
  EXPECT_EQ(hb2.load.waiting_tokens, hb.load.waiting_tokens);
  EXPECT_EQ(hb2.load.free_blocks, 17);
  EXPECT_EQ(hb2.load.total_blocks, 99);
  EXPECT_EQ(hb2.load.messages_rejected, 3);
  EXPECT_EQ(hb2.load.prefix_cache_hits, 48);
  EXPECT_EQ(hb2.load.prefix_cache_ssd_hits, 32);

  EXPECT_EQ(round_trip(PeerInfo{"decode-0", descriptor}).descriptor, descriptor);

  Generate gen{rng(), random_ints(rng, 1 + rng() % 3000, 150000), random_sampling(rng),
               "prefill-0"};
  Generate gen2 = round_trip(gen);
  EXPECT_EQ(gen2.request_id, gen.request_id);
  EXPECT_EQ(gen2.prompt, gen.prompt);
  expect_equal(gen2.sampling, gen.sampling);
  EXPECT_EQ(gen2.prefill_node, "prefill-0");

  PrefillReady ready{rng(), rng() % (1ull << 32), random_ints(rng, 200, 1 << 20),
                     int32_t(rng() % 1000), int32_t(rng() % 1000)};
  PrefillReady ready2 = round_trip(ready);
  EXPECT_EQ(ready2.request_id, ready.request_id);
  EXPECT_EQ(ready2.transfer_id, ready.transfer_id);
  EXPECT_EQ(ready2.dst_blocks, ready.dst_blocks);
  EXPECT_EQ(ready2.cached_blocks, ready.cached_blocks);
  EXPECT_EQ(ready2.skipped_blocks, ready.skipped_blocks);

  Prefill pre{rng(), random_ints(rng, 500, 150000), random_sampling(rng), "decode-1",
              77,    random_ints(rng, 32, 4096)};
  Prefill pre2 = round_trip(pre);
  EXPECT_EQ(pre2.prompt, pre.prompt);
  expect_equal(pre2.sampling, pre.sampling);
  EXPECT_EQ(pre2.decode_node, "decode-1");
  EXPECT_EQ(pre2.transfer_id, 77u);
  EXPECT_EQ(pre2.dst_blocks, pre.dst_blocks);
  EXPECT_EQ(pre2.cached_blocks, 0);
  EXPECT_EQ(pre2.skipped_blocks, 0);
  pre.cached_blocks = 12;
  pre.skipped_blocks = 5;
  EXPECT_EQ(round_trip(pre).cached_blocks, 12);
  EXPECT_EQ(round_trip(pre).skipped_blocks, 5);

  PrefillDone done{rng(), int32_t(rng() % 1000), rng() % 10, "peer lost", {}};
  done.first_logprobs.push_back({-1.25f, {5, 9, 2}, {-0.5f, -1.0f, -3.5f}});
  done.queue_seconds = float(rng() % 1000) / 64.0f;
  done.prefill_seconds = float(rng() % 1000) / 64.0f;
  PrefillDone done2 = round_trip(done);
  EXPECT_EQ(done2.queue_seconds, done.queue_seconds);
  EXPECT_EQ(done2.prefill_seconds, done.prefill_seconds);
  EXPECT_EQ(done2.request_id, done.request_id);
  EXPECT_EQ(done2.first_token, done.first_token);
  EXPECT_EQ(done2.rng_draws, done.rng_draws);
  EXPECT_EQ(done2.error, "peer lost");
  ASSERT_EQ(done2.first_logprobs.size(), 1u);
  EXPECT_EQ(done2.first_logprobs[0].logprob, -1.25f);
  EXPECT_EQ(done2.first_logprobs[0].top_ids, (std::vector<int32_t>{5, 9, 2}));
  EXPECT_EQ(done2.first_logprobs[0].top_logprobs, (std::vector<float>{-0.5f, -1.0f, -3.5f}));
  EXPECT_TRUE(done2.prompt_logprobs.empty());
  for (int p = 0; p < 3; ++p)
    done.prompt_logprobs.push_back({-float(rng() % 100) / 8.0f, {p, p + 1}, {-0.5f, -2.0f}});
  done2 = round_trip(done);
  ASSERT_EQ(done2.prompt_logprobs.size(), 3u);
  for (size_t p = 0; p < 3; ++p) {
    EXPECT_EQ(done2.prompt_logprobs[p].logprob, done.prompt_logprobs[p].logprob);
    EXPECT_EQ(done2.prompt_logprobs[p].top_ids, done.prompt_logprobs[p].top_ids);
    EXPECT_EQ(done2.prompt_logprobs[p].top_logprobs, done.prompt_logprobs[p].top_logprobs);
  }

  // Cached prompt tokens: absent (an older node) reads as -1.
  EXPECT_EQ(done2.cached_tokens, -1);
  done.cached_tokens = int32_t(rng() % 100000);
  EXPECT_EQ(round_trip(done).cached_tokens, done.cached_tokens);

  EXPECT_EQ(round_trip(Abort{42, "client disconnected"}).reason, "client disconnected");
  const uint64_t rejected_id = rng();
  Rejected rejected = round_trip(Rejected{"generate", rejected_id, "generate.prompt: not a list"});
  EXPECT_EQ(rejected.type, "generate");
  EXPECT_EQ(rejected.request_id, rejected_id);
  EXPECT_EQ(rejected.reason, "generate.prompt: not a list");

  Events events;
  for (int i = 0; i < 5; ++i) {
    // Each finish reason, and none.
    const FinishReason reason = FinishReason(i);
    TokenEvent event{rng(), random_ints(rng, 1 + rng() % 3, 150000), reason, "", {}};
    for (size_t t = 0; t < event.tokens.size(); ++t) {
      event.logprobs.push_back({-float(rng() % 100) / 10.0f, {int32_t(t)}, {-0.25f}});
    }
    if (i == 0) {
      event.queue_seconds = float(rng() % 1000) / 64.0f;
      event.prefill_seconds = float(rng() % 1000) / 64.0f;
      event.cached_tokens = int32_t(rng() % 100000);
      for (size_t p = 0; p < 1 + rng() % 4; ++p)
        event.prompt_logprobs.push_back({-float(rng() % 100) / 8.0f, {int32_t(p)}, {-0.75f}});
    }
    events.events.push_back(std::move(event));
  }
  Events events2 = round_trip(events);
  ASSERT_EQ(events2.events.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(events2.events[i].request_id, events.events[i].request_id);
    EXPECT_EQ(events2.events[i].tokens, events.events[i].tokens);
    EXPECT_EQ(events2.events[i].finish_reason, events.events[i].finish_reason);
    EXPECT_EQ(events2.events[i].queue_seconds, events.events[i].queue_seconds);
    EXPECT_EQ(events2.events[i].prefill_seconds, events.events[i].prefill_seconds);
    EXPECT_EQ(events2.events[i].cached_tokens, events.events[i].cached_tokens);  // -1: absent
    ASSERT_EQ(events2.events[i].prompt_logprobs.size(), events.events[i].prompt_logprobs.size());
    for (size_t p = 0; p < events.events[i].prompt_logprobs.size(); ++p) {
      EXPECT_EQ(events2.events[i].prompt_logprobs[p].logprob,
                events.events[i].prompt_logprobs[p].logprob);
      EXPECT_EQ(events2.events[i].prompt_logprobs[p].top_ids,
                events.events[i].prompt_logprobs[p].top_ids);
    }
    ASSERT_EQ(events2.events[i].logprobs.size(), events.events[i].logprobs.size());
    for (size_t t = 0; t < events.events[i].logprobs.size(); ++t) {
      EXPECT_EQ(events2.events[i].logprobs[t].logprob, events.events[i].logprobs[t].logprob);
      EXPECT_EQ(events2.events[i].logprobs[t].top_ids, events.events[i].logprobs[t].top_ids);
    }
  }
}

TEST(ControlMessages, EveryTruncationIsRejected) {
  std::mt19937_64 rng(std::random_device{}());
  Prefill pre{rng(), random_ints(rng, 64, 150000), random_sampling(rng), "decode-1",
              5,     random_ints(rng, 4, 4096)};
  std::vector<uint8_t> frame = encode(pre);
  for (size_t n = 0; n < frame.size(); ++n) {
    Result<Message> decoded = decode(std::span(frame.data(), n));
    ASSERT_FALSE(decoded.is_ok()) << "prefix of " << n << " bytes decoded";
    EXPECT_EQ(decoded.status().code(), StatusCode::kDataLoss);
  }
}

TEST(ControlMessages, RandomCorruptionNeverCrashes) {
  std::mt19937_64 rng(std::random_device{}());
  Events events;
  events.events.push_back({1, {1, 2, 3}, FinishReason::kNone, "", {}});
  std::vector<uint8_t> frame = encode(events);
  int rejected = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    std::vector<uint8_t> bad = frame;
    int flips = 1 + int(rng() % 4);
    for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] = uint8_t(rng());
    Result<Message> decoded = decode(bad);
    if (!decoded.is_ok()) {
      ++rejected;
      EXPECT_FALSE(decoded.status().message().empty());
    }
  }
  EXPECT_GT(rejected, 0);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> garbage(1 + rng() % 64);
    for (uint8_t& b : garbage) b = uint8_t(rng());
    (void)decode(garbage);  // must return, whatever it says
  }
}

TEST(ControlMessages, DeepNestingIsRejectedWithoutRecursingIntoIt) {
  std::vector<uint8_t> bomb(1 << 20, 0x91);  // fixarray of one element, a million deep
  bomb.push_back(0x00);
  Result<Message> decoded = decode(bomb);
  ASSERT_FALSE(decoded.is_ok());
  EXPECT_NE(decoded.status().message().find("nested"), std::string::npos)
      << decoded.status().message();
}

Result<Message> decode_json(const json& object) { return decode(json::to_msgpack(object)); }

// The fuzzer's seeds are messages of this protocol version, each of its
// type: seeds the decoder refused would leave the fuzzer knocking at the
// envelope.
TEST(ControlMessages, FuzzSeedsDecode) {
  const std::filesystem::path dir =
      std::filesystem::path(BATON_SOURCE_DIR) / "tests/fuzz/corpus/fuzz_control_message";
  int seeds = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    SCOPED_TRACE(entry.path().string());
    std::ifstream in(entry.path(), std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
    Result<Message> message = decode(bytes);
    ++seeds;
    if (!message.is_ok()) {
      ADD_FAILURE() << message.status().to_string();
      continue;
    }
    EXPECT_EQ(message_type(*message), entry.path().filename().string());
  }
  EXPECT_GE(seeds, 10);
}

// The names the codec and the OpenAI JSON spell: each reads back as itself.
TEST(FinishReasonNames, RoundTripAndRefuseOthers) {
  for (FinishReason r : {FinishReason::kNone, FinishReason::kStop, FinishReason::kLength,
                         FinishReason::kAborted, FinishReason::kError}) {
    EXPECT_EQ(parse_finish_reason(finish_reason_name(r)), r) << finish_reason_name(r);
  }
  EXPECT_EQ(finish_reason_name(FinishReason::kAborted), "abort");
  EXPECT_FALSE(parse_finish_reason("aborted").has_value());
  EXPECT_FALSE(parse_finish_reason("STOP").has_value());
}

TEST(RoleNames, RoundTripAndRefuseOthers) {
  for (Role r : {Role::kRouter, Role::kPrefill, Role::kDecode})
    EXPECT_EQ(parse_role(role_name(r)), r) << role_name(r);
  EXPECT_FALSE(parse_role("Decode").has_value());
  EXPECT_FALSE(parse_role("").has_value());
}

TEST(ControlMessages, EnvelopeAndFieldErrorsNameTheProblem) {
  auto message_of = [](const Result<Message>& r) {
    return r.is_ok() ? std::string("OK") : r.status().message();
  };
  constexpr int32_t v = kProtocolVersion;
  // Another version: its messages may mean other things.
  EXPECT_NE(
      message_of(decode_json({{"v", v + 1}, {"t", "abort"}, {"request_id", 1}, {"reason", ""}}))
          .find("version " + std::to_string(v + 1)),
      std::string::npos);
  EXPECT_NE(
      message_of(decode_json({{"v", v - 1}, {"t", "abort"}, {"request_id", 1}, {"reason", ""}}))
          .find("version " + std::to_string(v - 1)),
      std::string::npos);
  EXPECT_NE(message_of(decode_json({{"v", v}, {"t", "launch"}})).find("unknown type 'launch'"),
            std::string::npos);
  EXPECT_NE(message_of(decode_json({{"v", v}, {"t", "abort"}, {"reason", ""}}))
                .find("abort.request_id: missing"),
            std::string::npos);
  EXPECT_NE(message_of(decode_json({{"v", v}, {"t", "abort"}, {"request_id", "7"}, {"reason", ""}}))
                .find("abort.request_id: not an unsigned integer"),
            std::string::npos);
  EXPECT_NE(message_of(decode_json(json::array({1, 2}))).find("not a map"), std::string::npos);
  // A node registers as a prefill or a decode node, nothing else.
  json reg =
      json::from_msgpack(encode(Register{"n0", Role::kPrefill, {1}, 16, 1024, 1, "bf16", 2048}));
  ASSERT_TRUE(decode_json(reg).is_ok());
  for (const char* role : {"router", "encode", ""}) {
    reg["role"] = role;
    EXPECT_NE(message_of(decode_json(reg)).find("register.role: not prefill or decode"),
              std::string::npos)
        << message_of(decode_json(reg));
  }
  json unknown = json::from_msgpack(encode(Events{{{3, {4}, FinishReason::kStop, "", {}}}}));
  ASSERT_TRUE(decode_json(unknown).is_ok());
  unknown["events"][0]["finish_reason"] = "tired";
  EXPECT_NE(message_of(decode_json(unknown)).find("not a finish reason: 'tired'"),
            std::string::npos)
      << message_of(decode_json(unknown));

  Generate gen{9, {1, 2, 3}, {}, ""};
  json object = json::from_msgpack(encode(gen));
  object["prompt"] = json::array({1, -5});
  EXPECT_NE(message_of(decode_json(object)).find("generate.prompt: holds an out-of-range value"),
            std::string::npos);
  object = json::from_msgpack(encode(gen));
  object["sampling"]["max_tokens"] = 0;
  EXPECT_NE(message_of(decode_json(object)).find("max_tokens: out of range"), std::string::npos)
      << message_of(decode_json(object));
  object = json::from_msgpack(encode(gen));
  object["prompt"] = json::array();
  for (size_t i = 0; i <= kMaxPromptTokens; ++i) object["prompt"].push_back(1);
  EXPECT_NE(message_of(decode_json(object)).find(std::to_string(kMaxPromptTokens + 1) + " entries"),
            std::string::npos)
      << message_of(decode_json(object));

  // A negative count of cached blocks.
  object = json::from_msgpack(encode(PrefillReady{4, 5, {1, 2}, 1}));
  ASSERT_TRUE(decode_json(object).is_ok());
  object["cached_blocks"] = -1;
  EXPECT_NE(message_of(decode_json(object)).find("cached_blocks: out of range"), std::string::npos)
      << message_of(decode_json(object));
  object["cached_blocks"] = 1;
  object["skipped_blocks"] = -3;
  EXPECT_NE(message_of(decode_json(object)).find("skipped_blocks: out of range"), std::string::npos)
      << message_of(decode_json(object));

  // Log-probabilities that would not survive narrowing to float.
  PrefillDone done{3, 5, 0, "", {{-1.0f, {4}, {-0.5f}}}};
  object = json::from_msgpack(encode(done));
  ASSERT_TRUE(decode_json(object).is_ok());
  object["first_logprobs"][0]["lps"][0] = -1e300;
  EXPECT_NE(message_of(decode_json(object)).find("lps: holds a non-finite number"),
            std::string::npos)
      << message_of(decode_json(object));
  object = json::from_msgpack(encode(done));
  object["first_logprobs"][0]["lp"] = 1e300;
  EXPECT_NE(message_of(decode_json(object)).find("lp: not a finite number"), std::string::npos)
      << message_of(decode_json(object));
}

// What the receiver of a refused frame tells its sender: the type and the
// request id when the envelope is readable, and the refusal.
TEST(ControlMessages, ARefusedFrameNamesItsTypeAndRequest) {
  std::mt19937_64 rng(std::random_device{}());
  const uint64_t id = rng() >> 1;
  json object = json::from_msgpack(encode(Generate{id, {1, 2, 3}, {}, ""}));
  object["sampling"]["temperature"] = 1e300;
  std::vector<uint8_t> frame = json::to_msgpack(object);
  Result<Message> decoded = decode(frame);
  ASSERT_FALSE(decoded.is_ok());
  Rejected rejected = rejection_of(frame, decoded.status());
  EXPECT_EQ(rejected.type, "generate");
  EXPECT_EQ(rejected.request_id, id);
  EXPECT_NE(rejected.reason.find("temperature"), std::string::npos) << rejected.reason;
  // The answer itself must encode within the codec's bounds.
  EXPECT_TRUE(decode(encode(rejected)).is_ok());

  // Nothing readable: no type, no id, still the reason.
  std::vector<uint8_t> garbage(64);
  for (uint8_t& b : garbage) b = uint8_t(rng());
  garbage[0] = 0xc1;  // never valid MessagePack
  Result<Message> refused = decode(garbage);
  ASSERT_FALSE(refused.is_ok());
  Rejected unreadable = rejection_of(garbage, refused.status());
  EXPECT_EQ(unreadable.type, "");
  EXPECT_EQ(unreadable.request_id, 0u);
  EXPECT_EQ(unreadable.reason, refused.status().message());
  // A reason longer than a string field may be is cut to fit.
  Rejected long_reason = rejection_of(garbage, data_loss(std::string(3 * kMaxStringBytes, 'x')));
  EXPECT_EQ(long_reason.reason.size(), kMaxStringBytes);
  EXPECT_TRUE(decode(encode(long_reason)).is_ok());
}

// A heartbeat from a node of an older build lacks the newer load counters:
// they read as 0, and the rest as sent. A present one must still be valid.
// Every field of the load, each its own random value, comes back as sent.
// The codec and this test walk kNodeLoadFields: a member missing from it
// would never be sent, and nothing here would miss it. The table names
// every member of NodeLoad (all int64_t), each once.
static_assert(sizeof(NodeLoad) == std::size(kNodeLoadFields) * sizeof(int64_t),
              "a NodeLoad member is missing from kNodeLoadFields");

TEST(ControlMessages, HeartbeatCarriesEveryLoadField) {
  for (size_t i = 0; i < std::size(kNodeLoadFields); ++i)
    for (size_t j = 0; j < i; ++j)
      EXPECT_NE(kNodeLoadFields[i].member, kNodeLoadFields[j].member)
          << kNodeLoadFields[i].name << " and " << kNodeLoadFields[j].name;
  std::mt19937_64 rng{std::random_device{}()};
  Heartbeat hb{"decode-3", {}};
  for (const NodeLoadField& f : kNodeLoadFields) {
    hb.load.*f.member = int64_t(rng() % uint64_t(kMaxLoadValue + 1));
  }
  const Heartbeat back = round_trip(hb);
  for (const NodeLoadField& f : kNodeLoadFields)
    EXPECT_EQ(back.load.*f.member, hb.load.*f.member) << f.name;
  // Past the bound (which keeps the router's sums from overflowing): refused.
  for (const NodeLoadField& f : kNodeLoadFields) {
    Heartbeat over = hb;
    over.load.*f.member = kMaxLoadValue + 1;
    Result<Message> decoded = decode(encode(over));
    ASSERT_FALSE(decoded.is_ok()) << f.name;
    EXPECT_NE(decoded.status().message().find(f.name), std::string::npos)
        << decoded.status().message();
  }
}

// A prefill node's paths to its decode nodes come back as sent; a
// heartbeat without them reads as none; malformed ones are refused.
TEST(ControlMessages, HeartbeatCarriesKvPaths) {
  Heartbeat hb{
      "prefill-0",
      {},
      {{"decode-0", "rma (native) over rc_mlx5/mlx5_0:1"}, {"decode-1", "tag over tcp/lo"}}};
  EXPECT_EQ(round_trip(hb).kv_paths, hb.kv_paths);
  json object = json::from_msgpack(encode(hb));
  object.erase("kv_paths");
  Result<Message> decoded = decode_json(object);
  ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
  EXPECT_TRUE(std::get<Heartbeat>(*decoded).kv_paths.empty());
  for (const json& bad : {json(7), json({{"decode-0", 3}}),
                          json({{"decode-0", std::string(kMaxStringBytes + 1, 'x')}})}) {
    object["kv_paths"] = bad;
    decoded = decode_json(object);
    ASSERT_FALSE(decoded.is_ok()) << bad.dump().substr(0, 80);
    EXPECT_NE(decoded.status().message().find("heartbeat.kv_paths"), std::string::npos)
        << decoded.status().to_string();
  }
  json many = json::object();
  for (size_t i = 0; i <= kMaxKvPaths; ++i) {
    // Not "d" + to_string(i): GCC 12 warns (-Wrestrict) on that inlined.
    std::string name = std::to_string(i);
    name.insert(name.begin(), 'd');
    many[name] = "tag over tcp/lo";
  }
  object["kv_paths"] = many;
  EXPECT_FALSE(decode_json(object).is_ok());
  // As many as the bound allows cross the wire (its decoder bounds maps as
  // it reads them): a cluster of that many decode nodes.
  many.erase(many.begin());
  hb.kv_paths = many.get<std::map<std::string, std::string>>();
  ASSERT_EQ(hb.kv_paths.size(), kMaxKvPaths);
  EXPECT_EQ(round_trip(hb).kv_paths, hb.kv_paths);
}

// The most prompt log-probabilities the router lets a request ask for fit
// in a frame, at every number of alternatives; twice as many (what a long
// prompt with 20 alternatives came to before the router's bound) do not.
TEST(ControlMessages, PromptLogprobsWithinTheRoutersBoundFitInAFrame) {
  std::mt19937_64 rng{std::random_device{}()};
  auto frame_of = [&](size_t tokens, size_t alternatives) {
    PrefillDone done;
    done.request_id = 7;
    done.first_token = 3;
    for (size_t t = 0; t < tokens; ++t) {
      TokenLogprobs lp;
      lp.logprob = -float(rng() % 1000) / 7.0f;
      for (size_t a = 0; a < alternatives; ++a) {
        lp.top_ids.push_back(int32_t(rng() % 150000));
        lp.top_logprobs.push_back(-float(rng() % 1000) / 3.0f);
      }
      done.prompt_logprobs.push_back(std::move(lp));
    }
    return done;
  };
  for (size_t alternatives : {size_t(1), size_t(5), size_t(20)}) {
    SCOPED_TRACE(alternatives);
    const size_t tokens = max_prompt_logprob_tokens(alternatives);
    const PrefillDone done = frame_of(tokens, alternatives);
    const PrefillDone back = round_trip(done);
    ASSERT_EQ(back.prompt_logprobs.size(), tokens);
    EXPECT_EQ(back.prompt_logprobs.back().top_ids, done.prompt_logprobs.back().top_ids);
  }
  EXPECT_FALSE(decode(encode(frame_of(2 * max_prompt_logprob_tokens(20), 20))).is_ok());
  EXPECT_FALSE(decode(encode(frame_of(2 * max_prompt_logprob_tokens(1), 1))).is_ok());
}

// A step's events, several of them first tokens carrying as many prompt
// log-probabilities as the router allows a request, outgrow one frame (the
// decoder refuses it whole); split_events gives frames that each decode,
// holding the same events in the same order. Small events share frames.
TEST(ControlMessages, EventsSplitIntoFramesTheDecoderTakes) {
  std::mt19937_64 rng{std::random_device{}()};
  const size_t alternatives = 1 + rng() % 5;
  std::vector<TokenEvent> events;
  for (int i = 0; i < 7; ++i) {
    TokenEvent e;
    e.request_id = rng();
    e.tokens = {int32_t(rng() % 1000)};
    if (i % 2 == 0) {
      e.prompt_logprobs.resize(max_prompt_logprob_tokens(alternatives));
      for (TokenLogprobs& lp : e.prompt_logprobs) {
        lp.logprob = -float(rng() % 1000) / 7.0f;
        for (size_t a = 0; a < alternatives; ++a) {
          lp.top_ids.push_back(int32_t(rng() % 150000));
          lp.top_logprobs.push_back(-float(rng() % 1000) / 3.0f);
        }
      }
    }
    events.push_back(std::move(e));
  }
  Events whole;
  whole.events = events;
  ASSERT_FALSE(decode(encode(whole)).is_ok()) << "one frame holds them: the test says nothing";

  const std::vector<Events> frames = split_events(events);
  std::vector<TokenEvent> back;
  for (const Events& frame : frames) {
    const std::vector<uint8_t> bytes = encode(frame);
    EXPECT_LE(bytes.size(), kMaxMessageBytes / 4 * 3) << "the byte estimate is low";
    Result<Message> decoded = decode(bytes);
    ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
    for (TokenEvent& e : std::get<Events>(*decoded).events) back.push_back(std::move(e));
  }
  ASSERT_EQ(back.size(), events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(back[i].request_id, events[i].request_id);
    EXPECT_EQ(back[i].tokens, events[i].tokens);
    ASSERT_EQ(back[i].prompt_logprobs.size(), events[i].prompt_logprobs.size());
    if (!events[i].prompt_logprobs.empty())
      EXPECT_EQ(back[i].prompt_logprobs.back().top_ids, events[i].prompt_logprobs.back().top_ids);
  }
  // A frame per large event at most, not one per event.
  EXPECT_LE(frames.size(), 4u);
  std::vector<TokenEvent> small(1000);
  EXPECT_EQ(split_events(small).size(), 1u);
  EXPECT_TRUE(split_events({}).empty());
}

// What a node computed always decodes: non-finite or huge log-probabilities
// (NaN logits the engine serves on) and an error past the string bound
// would have the router refuse the frame, and with it every event of the
// step. They go out clamped and cut (at a UTF-8 boundary).
TEST(ControlMessages, WhatANodeComputedAlwaysDecodes) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  TokenEvent e;
  e.request_id = 5;
  e.tokens = {1};
  e.finish_reason = FinishReason::kError;
  while (e.error.size() < 3 * kMaxStringBytes) e.error += "\xc3\xa9";  // U+00E9, two bytes
  e.error.insert(0, "x");  // the bound falls inside a sequence
  e.logprobs.push_back({nan, {1, 2, 3}, {-inf, inf, 3e38f}});
  e.queue_seconds = inf;
  Events events;
  events.events = {e};
  Result<Message> back = decode(encode(events));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  const TokenEvent& got = std::get<Events>(*back).events.at(0);
  // The bound: the largest float within kMaxRealMagnitude.
  const float bound = got.queue_seconds;
  EXPECT_LE(double(bound), kMaxRealMagnitude);
  EXPECT_GT(double(bound), 0.99 * kMaxRealMagnitude);
  EXPECT_EQ(got.logprobs.at(0).logprob, -bound);
  EXPECT_EQ(got.logprobs.at(0).top_logprobs, (std::vector<float>{-bound, bound, bound}));
  ASSERT_LE(got.error.size(), kMaxStringBytes);
  EXPECT_EQ(got.error, e.error.substr(0, got.error.size()));
  EXPECT_EQ(got.error.size() % 2, 1u) << "cut inside a two-byte sequence";
  EXPECT_GE(got.error.size(), kMaxStringBytes - 1);

  PrefillDone done;
  done.request_id = 6;
  done.error = e.error;
  done.first_logprobs.push_back({nan, {}, {}});
  done.prefill_seconds = nan;
  Result<Message> done_back = decode(encode(done));
  ASSERT_TRUE(done_back.is_ok()) << done_back.status().to_string();
  EXPECT_LE(std::get<PrefillDone>(*done_back).error.size(), kMaxStringBytes);
}

TEST(ControlMessages, HeartbeatLoadFieldsAbsentReadAsZero) {
  Heartbeat hb{"decode-0", {}};
  hb.load.running = 5;
  hb.load.prefix_cache_hits = 64;
  hb.load.prefix_cache_ssd_hits = 48;
  json object = json::from_msgpack(encode(hb));
  object["load"].erase("prefix_cache_ssd_hits");
  object["load"].erase("prefix_cache_queries");
  Result<Message> decoded = decode_json(object);
  ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
  const auto& got = std::get<Heartbeat>(*decoded);
  EXPECT_EQ(got.load.running, 5);
  EXPECT_EQ(got.load.prefix_cache_hits, 64);
  EXPECT_EQ(got.load.prefix_cache_ssd_hits, 0);
  EXPECT_EQ(got.load.prefix_cache_queries, 0);
  object["load"]["prefix_cache_ssd_hits"] = -1;
  decoded = decode_json(object);
  ASSERT_FALSE(decoded.is_ok());
  EXPECT_NE(decoded.status().message().find("prefix_cache_ssd_hits: out of range"),
            std::string::npos)
      << decoded.status().to_string();
}

TEST(ControlMessages, OversizedFrameIsRejectedBeforeParsing) {
  std::vector<uint8_t> frame(kMaxMessageBytes + 1, 0);
  Result<Message> decoded = decode(frame);
  ASSERT_FALSE(decoded.is_ok());
  EXPECT_NE(decoded.status().message().find("over the limit"), std::string::npos);
}

// Frames whose shape no message has are refused as their headers are read,
// before what they declare is built: a list longer than any prompt, a map
// with more entries than any message, more values or maps than the largest
// message holds. Each is well under kMaxMessageBytes.
TEST(ControlMessages, ShapesNoMessageHasAreRefusedWhileDecoding) {
  const auto msgpack_list_header = [](std::vector<uint8_t>& out, uint32_t n) {
    out.push_back(0xdd);  // array 32
    for (int s = 24; s >= 0; s -= 8) out.push_back(uint8_t(n >> s));
  };
  // A list declaring 15 million entries, of which none follow.
  std::vector<uint8_t> frame = {0x81, 0xa1, 'x'};
  msgpack_list_header(frame, 15u << 20);
  auto decoded = decode(frame);
  ASSERT_FALSE(decoded.is_ok());
  EXPECT_NE(decoded.status().message().find("entries, over"), std::string::npos)
      << decoded.status().message();

  // A map declaring 2000 entries (a heartbeat's kv_paths may hold 1024).
  frame = {0xde, 0x07, 0xd0};
  decoded = decode(frame);
  ASSERT_FALSE(decoded.is_ok());
  EXPECT_NE(decoded.status().message().find("a map of 2000 entries"), std::string::npos)
      << decoded.status().message();

  // Lists within bounds, holding too many values together: 3 x 900k zeros.
  frame = {0x83};
  for (char key : {'a', 'b', 'c'}) {
    frame.push_back(0xa1);
    frame.push_back(uint8_t(key));
    msgpack_list_header(frame, 900000);
    frame.insert(frame.end(), 900000, 0x00);
  }
  decoded = decode(frame);
  ASSERT_FALSE(decoded.is_ok());
  EXPECT_NE(decoded.status().message().find("values"), std::string::npos)
      << decoded.status().message();

  // 300k empty maps.
  frame = {0x81, 0xa1, 'm'};
  msgpack_list_header(frame, 300000);
  frame.insert(frame.end(), 300000, 0x80);
  decoded = decode(frame);
  ASSERT_FALSE(decoded.is_ok());
  EXPECT_NE(decoded.status().message().find("maps"), std::string::npos)
      << decoded.status().message();

  // The largest legitimate frames still decode: a generate message with a
  // prompt of kMaxPromptTokens tokens.
  Generate gen{1, std::vector<int32_t>(kMaxPromptTokens, 7), {}, ""};
  auto big = decode(encode(gen));
  ASSERT_TRUE(big.is_ok()) << big.status().message();
  EXPECT_EQ(std::get<Generate>(*big).prompt.size(), kMaxPromptTokens);
}

}  // namespace
}  // namespace baton::control

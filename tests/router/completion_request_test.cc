#include "router/completion_request.h"

#include <gtest/gtest.h>

#include <chrono>

#include "common/control_messages.h"
#include "router/api_error.h"

namespace baton::router {
namespace {

TEST(CompletionRequest, DefaultsLikeVllm) {
  auto r = parse_completion_request(R"({"model": "m", "prompt": "hi"})");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->model, "m");
  ASSERT_EQ(r->prompts.size(), 1u);
  EXPECT_EQ(std::get<std::string>(r->prompts[0]), "hi");
  EXPECT_EQ(r->sampling.max_tokens, 16);
  EXPECT_EQ(r->sampling.temperature, 1.0f);
  EXPECT_EQ(r->sampling.top_p, 1.0f);
  EXPECT_EQ(r->sampling.top_k, 0);
  EXPECT_EQ(r->sampling.n, 1);
  EXPECT_FALSE(r->sampling.stream);
  EXPECT_FALSE(r->sampling.seed.has_value());
}

TEST(CompletionRequest, EveryFieldAndPromptForm) {
  auto r = parse_completion_request(R"({
    "model": "m", "prompt": [[1, 2, 3], "text", [7]], "max_tokens": 5, "temperature": 0,
    "top_p": 0.5, "top_k": -1, "seed": -3, "stop": ["a", "bc"], "stop_token_ids": [4, 5],
    "ignore_eos": true, "n": 2, "stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": false},
    "logprobs": 3, "return_tokens_as_token_ids": true})");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->prompts.size(), 3u);
  EXPECT_EQ(std::get<std::vector<int32_t>>(r->prompts[0]), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(std::get<std::string>(r->prompts[1]), "text");
  EXPECT_EQ(std::get<std::vector<int32_t>>(r->prompts[2]), (std::vector<int32_t>{7}));
  const auto& s = r->sampling;
  EXPECT_EQ(s.max_tokens, 5);
  EXPECT_EQ(s.temperature, 0.0f);
  EXPECT_EQ(s.top_p, 0.5f);
  EXPECT_EQ(s.top_k, 0);
  EXPECT_EQ(s.seed, uint64_t(int64_t(-3)));
  EXPECT_EQ(s.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(s.stop_token_ids, (std::vector<int32_t>{4, 5}));
  EXPECT_TRUE(s.ignore_eos);
  EXPECT_EQ(s.n, 2);
  EXPECT_TRUE(s.stream);
  EXPECT_TRUE(s.include_usage);
  EXPECT_TRUE(s.want_logprobs);
  EXPECT_EQ(s.logprobs, 3);
  EXPECT_TRUE(s.tokens_as_ids);

  // -1 is vLLM's "off" (0 on the wire); a positive top_k is kept.
  auto top_k = parse_completion_request(R"({"prompt": "x", "top_k": 7})");
  ASSERT_TRUE(top_k.is_ok()) << top_k.status().to_string();
  EXPECT_EQ(top_k->sampling.top_k, 7);

  auto ids = parse_completion_request(R"({"prompt": [9, 8], "stop": "x"})");
  ASSERT_TRUE(ids.is_ok());
  EXPECT_FALSE(ids->sampling.want_logprobs) << "not asked for";
  EXPECT_FALSE(ids->sampling.tokens_as_ids);
  // 0 asks for the chosen tokens' log-probabilities, with no alternatives.
  auto own_only = parse_completion_request(R"({"prompt": "x", "logprobs": 0})");
  ASSERT_TRUE(own_only.is_ok());
  EXPECT_TRUE(own_only->sampling.want_logprobs);
  EXPECT_EQ(own_only->sampling.logprobs, 0);
  EXPECT_EQ(std::get<std::vector<int32_t>>(ids->prompts[0]), (std::vector<int32_t>{9, 8}));
  EXPECT_EQ(ids->sampling.stop, (std::vector<std::string>{"x"}));
}

TEST(CompletionRequest, InvalidFieldsAreNamed) {
  struct Case {
    const char* body;
    const char* expect;
  } cases[] = {
      {"not json", "not valid JSON"},
      {"[1, 2]", "must be a JSON object"},
      {R"({"model": "m"})", "'prompt' is required"},
      {R"({"prompt": ""})", "'prompt' must not be empty"},
      {R"({"prompt": []})", "'prompt' must be"},
      {R"({"prompt": {"a": 1}})", "'prompt' must be"},
      {R"({"prompt": [1, "x"]})", "'prompt[1]' must be an integer"},
      {R"({"prompt": [1, -2]})", "'prompt[1]' must be in"},
      {R"({"prompt": ["a", 3]})", "'prompt[1]' must be a string or a list"},
      {R"({"prompt": ["a", []]})", "'prompt[1]' must not be empty"},
      {R"({"prompt": "x", "model": 3})", "'model' must be a string"},
      {R"({"prompt": "x", "max_tokens": 0})", "'max_tokens' must be in"},
      {R"({"prompt": "x", "max_tokens": 1.5})", "'max_tokens' must be an integer"},
      {R"({"prompt": "x", "max_tokens": 1000000000000000000000000000000})",
       "'max_tokens' is out of range"},
      {R"({"prompt": "x", "temperature": -0.1})", "'temperature' must be at least 0"},
      {R"({"prompt": "x", "temperature": "hot"})", "'temperature' must be a number"},
      {R"({"prompt": "x", "top_p": 0})", "'top_p' must be in (0, 1]"},
      {R"({"prompt": "x", "top_p": 1.5})", "'top_p' must be in (0, 1]"},
      // Positive, but 0 as the 32-bit float the nodes take.
      {R"({"prompt": "x", "top_p": 1e-300})", "'top_p' must be in (0, 1] (as a 32-bit float)"},
      {R"({"prompt": "x", "repetition_penalty": 1e-46})",
       "'repetition_penalty' must be in (0, 10] (as a 32-bit float)"},
      {R"({"prompt": "x", "repetition_penalty": 0})",
       "'repetition_penalty' must be in (0, 10], got"},
      {R"({"prompt": "x", "top_k": -2})", "'top_k' must be in"},
      {R"({"prompt": "x", "seed": 1.5})", "'seed' must be an integer"},
      {R"({"prompt": "x", "seed": 18446744073709551615})", "'seed' is out of range"},
      {R"({"prompt": "x", "stop": 3})", "'stop' must be a string or a list"},
      {R"({"prompt": "x", "stop": [""]})", "'stop' must not contain an empty string"},
      {R"({"prompt": "x", "stop_token_ids": [1, "a"]})", "'stop_token_ids[1]'"},
      {R"({"prompt": "x", "ignore_eos": 1})", "'ignore_eos' must be true or false"},
      {R"({"prompt": "x", "n": 0})", "'n' must be in"},
      {R"({"prompt": "x", "n": 1000})", "'n' must be in"},
      {R"({"prompt": "x", "stream": "yes"})", "'stream' must be true or false"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})",
       "'stream_options' can only be given when 'stream' is true"},
      {R"({"prompt": "x", "stream": true, "stream_options": {"continuous_usage_stats": true}})",
       "'stream_options.continuous_usage_stats' is not supported"},
      {R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": true, "x": 1}})",
       "'stream_options' has no field 'x'"},
      {R"({"prompt": "x", "logprobs": 100})", "'logprobs' must be in"},
      {R"({"prompt": "x", "return_tokens_as_token_ids": 1})",
       "'return_tokens_as_token_ids' must be true or false"},
      {R"({"prompt": "x", "logit_bias": {"01": 1, "1": -100}})",
       "'logit_bias' names token id 1 twice"},
      {R"({"prompt": "x", "logit_bias": {"a": 1}})", "'logit_bias' keys must be token ids"},
  };
  for (const auto& c : cases) {
    auto r = parse_completion_request(c.body);
    ASSERT_FALSE(r.is_ok()) << c.body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.body;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
        << c.body << " -> " << r.status().message();
    auto error = api_error_from_status(r.status()).to_json();
    EXPECT_EQ(error["error"]["code"], 400);
    EXPECT_EQ(error["error"]["type"], "BadRequestError");
    EXPECT_EQ(error["error"]["message"], r.status().message());
  }
  // Stop strings up to kMaxStopStringBytes, one byte more refused.
  for (const size_t bytes : {kMaxStopStringBytes, kMaxStopStringBytes + 1}) {
    const nlohmann::json body = {{"prompt", "x"}, {"stop", {"a", std::string(bytes, 's')}}};
    auto r = parse_completion_request(body.dump());
    EXPECT_EQ(r.is_ok(), bytes <= kMaxStopStringBytes) << bytes;
    if (!r.is_ok())
      EXPECT_NE(r.status().message().find("'stop' has a string of"), std::string::npos)
          << r.status().message();
  }
}

TEST(ChatRequest, MessagesAndChatOnlyFields) {
  auto r = parse_chat_request(R"({
    "model": "m", "messages": [{"role": "system", "content": "be brief"},
                               {"role": "user", "content": [{"type": "text", "text": "a"},
                                                            {"type": "text", "text": "b"}]}],
    "max_completion_tokens": 7, "logprobs": true, "top_logprobs": 2})");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->messages.size(), 2u);
  EXPECT_EQ(r->messages[0].role, "system");
  EXPECT_EQ(r->messages[1].content, "a\nb");  // vLLM's join
  EXPECT_EQ(r->sampling.max_tokens, 7);
  EXPECT_TRUE(r->sampling.want_logprobs);
  EXPECT_EQ(r->sampling.logprobs, 2);
  // As OpenAI: logprobs without top_logprobs shows no alternatives.
  auto no_top =
      parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})");
  ASSERT_TRUE(no_top.is_ok());
  EXPECT_TRUE(no_top->sampling.want_logprobs);
  EXPECT_EQ(no_top->sampling.logprobs, 0);

  struct Case {
    const char* body;
    const char* expect;
  } cases[] = {
      {R"({"model": "m"})", "'messages' is required"},
      {R"({"messages": []})", "'messages' must be a non-empty list"},
      {R"({"messages": [{"role": "robot", "content": "x"}]})", "'messages[0].role' must be"},
      {R"({"messages": [{"role": "user"}]})", "'messages[0].content' is required"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "'messages[0].content[0]'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",
       "'top_logprobs' requires 'logprobs'"},
  };
  for (const auto& c : cases) {
    auto bad = parse_chat_request(c.body);
    ASSERT_FALSE(bad.is_ok()) << c.body;
    EXPECT_NE(bad.status().message().find(c.expect), std::string::npos)
        << c.body << " -> " << bad.status().message();
  }
}

TEST(ApiError, StatusCodesMapToHttp) {
  EXPECT_EQ(api_error_from_status(not_found("no model x")).http_status, 404);
  EXPECT_EQ(api_error_from_status(resource_exhausted("queue full")).http_status, 429);
  EXPECT_EQ(api_error_from_status(unavailable("no decode node")).http_status, 503);
  EXPECT_EQ(api_error_from_status(internal_error("bug")).http_status, 500);
  auto json = api_error_from_status(not_found("The model `x` does not exist.")).to_json();
  EXPECT_EQ(json["error"]["type"], "NotFoundError");
  EXPECT_TRUE(json["error"]["param"].is_null());
}

// Random bytes and truncations of a valid body never crash the parser.
TEST(CompletionRequest, GarbageIsRejectedNotCrashing) {
  std::string valid = R"({"model": "m", "prompt": [[1, 2], "abc"], "stop": ["x"], "n": 2})";
  for (size_t cut = 0; cut < valid.size(); ++cut) {
    auto r = parse_completion_request(valid.substr(0, cut));
    EXPECT_FALSE(r.is_ok()) << cut;
  }
  uint32_t state = 12345;
  for (int i = 0; i < 2000; ++i) {
    std::string body = valid;
    for (int k = 0; k < 3; ++k) {
      state = state * 1664525u + 1013904223u;
      body[state % body.size()] = char(state >> 24);
    }
    (void)parse_completion_request(body);
    (void)parse_chat_request(body);
  }
}

// Hostile shapes: a value nested far deeper than any OpenAI field, in a
// numeric field (whose error message used to serialise it recursively and
// echo it whole), and a content part whose "type" is not a string (which
// used to throw from the JSON library). Each is a short InvalidArgument.
TEST(CompletionRequest, HostileNestingAndTypesAreShortErrors) {
  const std::string deep(120000, '[');
  for (const std::string& body :
       {R"({"prompt": "x", "max_tokens": )" + deep + "}",
        R"({"prompt": "x", "max_tokens": )" + std::string(40, '[') + std::string(40, ']') + "}",
        R"({"prompt": "x", "temperature": ")" + std::string(100000, 'x') + "\"}"}) {
    auto r = parse_completion_request(body);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_LT(r.status().message().size(), 200u) << r.status().message().substr(0, 300);
  }
  for (const char* part : {R"({"type": 5, "text": "hi"})", R"({"type": "text", "text": 5})",
                           R"({"type": null, "text": "hi"})", R"({"type": ["text"]})"}) {
    auto r = parse_chat_request(std::string(R"({"messages": [{"role": "user", "content": [)") +
                                part + "]}]}");
    ASSERT_FALSE(r.is_ok()) << part;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << part;
    EXPECT_NE(r.status().message().find("messages[0].content[0]"), std::string::npos)
        << r.status().message();
  }
  // Nesting at the limit is still parsed (and refused only for its meaning).
  auto at_limit =
      parse_completion_request(R"({"prompt": "x", "stop": )" + std::string(kMaxJsonDepth - 1, '[') +
                               std::string(kMaxJsonDepth - 1, ']') + "}");
  ASSERT_FALSE(at_limit.is_ok());
  EXPECT_NE(at_limit.status().message().find("'stop'"), std::string::npos)
      << at_limit.status().message();
}

// An ordered parse (what chat bodies get, for their templates) of an object
// of n members costs n^2: a body of one wide object, or tool-call arguments
// (a string the body's checks skip, parsed again) deep or wide, are 400s
// before any such parse, quickly.
TEST(CompletionRequest, WideObjectsAndDeepOrWideToolArgumentsAreRefusedQuickly) {
  auto object_of = [](size_t members) {
    std::string text = "{";
    for (size_t i = 0; i < members; ++i) text += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":0";
    return text + "}";
  };
  const auto start = std::chrono::steady_clock::now();
  const std::string wide = object_of(500000);
  auto refused = parse_chat_request(
      R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": )" + wide + "}");
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("an object of more than 1024 members"),
            std::string::npos)
      << refused.status().message();
  auto with_arguments = [](const std::string& arguments) {
    return parse_chat_request(
        R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": )" +
        nlohmann::json(arguments).dump() + "}}]}]}");
  };
  auto deep =
      with_arguments("{\"a\": " + std::string(1000000, '[') + std::string(1000000, ']') + "}");
  ASSERT_FALSE(deep.is_ok());
  EXPECT_NE(deep.status().message().find("messages[1].tool_calls[0].function.arguments"),
            std::string::npos)
      << deep.status().message();
  EXPECT_NE(deep.status().message().find("deeper than"), std::string::npos);
  auto wide_arguments = with_arguments(object_of(200000));
  ASSERT_FALSE(wide_arguments.is_ok());
  EXPECT_NE(wide_arguments.status().message().find("more than 1024 members"), std::string::npos)
      << wide_arguments.status().message();
  // Seconds, not the minutes a parse that grew past linear would take; a
  // sanitizer's unoptimised build takes several times the release's.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr auto kQuickly = std::chrono::seconds(20);
#else
  constexpr auto kQuickly = std::chrono::seconds(5);
#endif
  EXPECT_LT(std::chrono::steady_clock::now() - start, kQuickly);
  // At the bound, all is parsed as before: the arguments become an object.
  auto fine = with_arguments(object_of(kMaxJsonObjectMembers));
  ASSERT_TRUE(fine.is_ok()) << fine.status().to_string();
  EXPECT_EQ(fine->template_messages[1]["tool_calls"][0]["function"]["arguments"].size(),
            kMaxJsonObjectMembers);
}

// Empty lists and objects parse to some 20 times their bytes, and a chat
// body is held parsed several times: a body holds at most
// kMaxJsonContainers of them (one more is a 400 naming the bound), and the
// tool-call arguments of its messages as many again, together.
TEST(CompletionRequest, ListsAndObjectsAreCountedBeforeParsing) {
  auto with_extra = [](size_t objects) {
    std::string extra = "[";
    for (size_t i = 0; i < objects; ++i) extra += i ? ",{}" : "{}";
    // The body, its messages list, the message and the extra list: four more.
    return R"({"messages": [{"role": "user", "content": "hi", "extra": )" + extra + "]}]}";
  };
  auto at_bound = parse_chat_request(with_extra(kMaxJsonContainers - 4));
  ASSERT_TRUE(at_bound.is_ok()) << at_bound.status().to_string();
  auto over = parse_chat_request(with_extra(kMaxJsonContainers - 3));
  ASSERT_FALSE(over.is_ok());
  EXPECT_NE(over.status().message().find("more than 65536 lists and objects"), std::string::npos)
      << over.status().message();
  auto over_tokenize = parse_tokenize_request(with_extra(kMaxJsonContainers));
  EXPECT_FALSE(over_tokenize.is_ok());

  // Arguments strings: each well under the bound, together over it.
  auto arguments_of = [](size_t lists) {
    std::string text = "{\"a\": [";
    for (size_t i = 0; i < lists; ++i) text += i ? ",[]" : "[]";
    return nlohmann::json(text + "]}").dump();
  };
  auto call = [&](size_t lists) {
    return R"({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": )" +
           arguments_of(lists) + "}}]}";
  };
  const size_t half = kMaxJsonContainers / 2;  // each string: half - 2 lists and 2 more
  auto body = [&](size_t second) {
    return R"({"messages": [{"role": "user", "content": "hi"}, )" + call(half - 2) + ", " +
           call(second) + "]}";
  };
  auto fits = parse_chat_request(body(half - 2));
  ASSERT_TRUE(fits.is_ok()) << fits.status().to_string();
  auto too_many = parse_chat_request(body(half - 1));
  ASSERT_FALSE(too_many.is_ok());
  EXPECT_NE(too_many.status().message().find("messages[2].tool_calls[0].function.arguments"),
            std::string::npos)
      << too_many.status().message();
}

// What the router admits, the nodes' control codec accepts: values past the
// codec's bounds are 400s here (before, they were admitted, dropped by the
// node's decoder, and the request hung until the router's timeout), and
// values at the bounds encode and decode.
// generation_config.json's defaults fill the sampling fields a request
// leaves out, never the ones it sets.
TEST(CompletionRequest, CheckpointDefaultsFillOnlyWhatTheRequestLeavesOut) {
  RequestLimits limits;
  limits.default_temperature = 0.6f;
  limits.default_top_p = 0.9f;
  limits.default_top_k = 40;
  auto left_out = parse_completion_request(R"({"prompt": "x"})", limits);
  ASSERT_TRUE(left_out.is_ok());
  EXPECT_FLOAT_EQ(left_out->sampling.temperature, 0.6f);
  EXPECT_FLOAT_EQ(left_out->sampling.top_p, 0.9f);
  EXPECT_EQ(left_out->sampling.top_k, 40);
  auto set = parse_chat_request(
      R"({"messages": [{"role": "user", "content": "x"}], "temperature": 0, "top_p": 1,
          "top_k": -1})",
      limits);
  ASSERT_TRUE(set.is_ok());
  EXPECT_EQ(set->sampling.temperature, 0.0f);
  EXPECT_EQ(set->sampling.top_p, 1.0f);
  EXPECT_EQ(set->sampling.top_k, 0);
  auto plain = parse_completion_request(R"({"prompt": "x"})");
  ASSERT_TRUE(plain.is_ok());
  EXPECT_EQ(plain->sampling.temperature, 1.0f);  // vLLM's own defaults
}

TEST(CompletionRequest, WhatTheRouterAdmitsTheControlCodecAccepts) {
  auto through_codec = [](const SamplingFields& f) {
    control::Generate g;
    g.request_id = 7;
    g.prompt = {1, 2, 3};
    g.sampling.temperature = f.temperature;
    g.sampling.top_p = f.top_p;
    g.sampling.top_k = f.top_k;
    g.sampling.max_tokens = f.max_tokens;
    g.sampling.stop_token_ids = f.stop_token_ids;
    g.sampling.logprobs = f.logprobs;
    return control::decode(control::encode(control::Message{g})).status();
  };
  std::string many_ids, too_many_ids;
  for (size_t i = 0; i < control::kMaxStopTokenIds; ++i)
    many_ids += std::string(i ? "," : "") + std::to_string(i);
  too_many_ids = many_ids + ",5";
  const std::vector<std::string> admitted = {
      R"({"prompt": "x", "temperature": 9.99999e29})",
      R"({"prompt": "x", "temperature": 0, "top_p": 1e-30})",
      R"({"prompt": "x", "stop_token_ids": [)" + many_ids + "]}",
      R"({"prompt": "x", "top_k": 2147483647, "max_tokens": 2147483647})",
      R"({"prompt": "x", "logprobs": 20})"};
  for (const auto& body : admitted) {
    auto r = parse_completion_request(body);
    ASSERT_TRUE(r.is_ok()) << body.substr(0, 80) << ": " << r.status().to_string();
    EXPECT_TRUE(through_codec(r->sampling).is_ok()) << body.substr(0, 80);
  }
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"({"prompt": "x", "temperature": 1e300})", "temperature"},
      {R"({"prompt": "x", "temperature": 1e30})", "temperature"},  // 1.00000002e30 as a float
      {R"({"prompt": "x", "stop_token_ids": [)" + too_many_ids + "]}", "stop_token_ids"}};
  for (const auto& [body, field] : refused) {
    auto r = parse_completion_request(body);
    ASSERT_FALSE(r.is_ok()) << body.substr(0, 80);
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace baton::router

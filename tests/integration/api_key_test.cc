// API keys on a real cluster: with a key configured, the /v1/ routes answer
// 401 in vLLM's shape without it or with another, over HTTP and ZeroMQ;
// /health stays open; `baton up` itself comes up (it polls /v1/nodes with
// the key); the key opens everything.
#include <gtest/gtest.h>

#include <random>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "tests/integration/cluster_harness.h"
#include "tools/http_client.h"

namespace baton::testing {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

std::string random_key(std::mt19937& rng) {
  std::string key = "sk-";
  for (int i = 0; i < 24; ++i) key += "abcdefghijklmnopqrstuvwxyz0123456789"[rng() % 36];
  return key;
}

// One ZeroMQ request, as [tag, path, body] or with the key as a fifth frame.
std::vector<std::string> zmq_call(uint16_t port, const std::string& path, const std::string& body,
                                  const std::string* key) {
  zmq::context_t context;
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::rcvtimeo, 20000);
  socket.connect("tcp://127.0.0.1:" + std::to_string(port));
  std::vector<zmq::const_buffer> parts = {zmq::str_buffer("t"), zmq::buffer(path),
                                          zmq::buffer(body)};
  if (key != nullptr) parts.push_back(zmq::buffer(*key));
  EXPECT_TRUE(zmq::send_multipart(socket, parts));
  std::vector<zmq::message_t> reply;
  if (!zmq::recv_multipart(socket, std::back_inserter(reply))) return {};
  std::vector<std::string> out;
  for (auto& part : reply) out.push_back(part.to_string());
  return out;
}

TEST(ApiKeyTest, KeyedRoutesRefuseStrangersAndOpenForTheKey) {
  std::mt19937 rng(std::random_device{}());
  ClusterShape shape;
  shape.api_key = random_key(rng);
  Cluster cluster(shape);  // comes up: `baton up` polled /v1/nodes with the key

  const std::string body = json{{"prompt", "hello"}, {"max_tokens", 4}, {"temperature", 0}}.dump();
  const std::string wrong = random_key(rng);
  const std::string prefix = shape.api_key.substr(0, shape.api_key.size() - 1);
  for (const std::string* offered :
       std::initializer_list<const std::string*>{nullptr, &wrong, &prefix}) {
    const std::string key = offered == nullptr ? "" : *offered;
    for (const char* target : {"/v1/completions", "/v1/chat/completions"}) {
      auto r =
          tools::http_request("127.0.0.1", cluster.http_port(), "POST", target, body, 10s, key);
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      EXPECT_EQ(r->status, 401) << target << " with '" << key << "'";
      EXPECT_EQ(json::parse(r->body), json({{"error", "Unauthorized"}}));
    }
    for (const char* target : {"/v1/models", "/v1/nodes"}) {
      auto r = tools::http_request("127.0.0.1", cluster.http_port(), "GET", target, {}, 10s, key);
      ASSERT_TRUE(r.is_ok());
      EXPECT_EQ(r->status, 401) << target;
    }
    auto z = zmq_call(cluster.zmq_port(), "/v1/completions", body, offered);
    ASSERT_EQ(z.size(), 3u);
    EXPECT_EQ(z[1], "401");
  }
  // Open without the key, as in vLLM.
  for (const char* target : {"/health", "/metrics"}) {
    auto r = tools::http_request("127.0.0.1", cluster.http_port(), "GET", target, {}, 10s);
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->status, 200) << target;
  }
  // The key opens the same routes.
  auto done = cluster.post("/v1/completions", json::parse(body));
  ASSERT_TRUE(done.is_ok());
  EXPECT_EQ(done->status, 200) << done->body;
  auto z = zmq_call(cluster.zmq_port(), "/v1/completions", body, &shape.api_key);
  ASSERT_EQ(z.size(), 3u);
  EXPECT_EQ(z[1], "200") << z[2];
  EXPECT_EQ(json::parse(z[2])["choices"][0]["text"], json::parse(done->body)["choices"][0]["text"]);
}

}  // namespace
}  // namespace baton::testing

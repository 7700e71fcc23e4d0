// The control plane over CURVE on a real cluster: with router.control_keys,
// the nodes register and serve as before, while a process without the
// nodes' key (in the clear, or over CURVE with a key of its own) never gets
// a message through: the router answers it nothing, where it answers a
// holder of the key (refusing a name the cluster does not have).
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <thread>

#include "common/control_socket.h"
#include "common/curve_keys.h"
#include "tests/integration/cluster_harness.h"

namespace baton::testing {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

// Tries to register as a decode node named `name` for a second; whether the
// router answered.
bool router_answers(const Cluster& cluster, const std::string& name,
                    const control::CurveKeys* keys) {
  auto socket = control::ControlSocket::connect(
      "tcp://127.0.0.1:" + std::to_string(cluster.control_port()), name, keys);
  EXPECT_TRUE(socket.is_ok()) << socket.status().to_string();
  if (!socket.is_ok()) return false;
  control::Register hello{name, Role::kDecode, {1, 2, 3}, 16, 1024, 1, "f32", 256, "cpu", ""};
  for (int i = 0; i < 10; ++i) {
    (void)(*socket)->send("", hello);
    for (const auto& received : (*socket)->poll(100ms)) {
      if (std::holds_alternative<control::RegisterAck>(received.message)) return true;
    }
  }
  return false;
}

TEST(ControlKeysTest, OnlyHoldersOfTheNodesKeyRegister) {
  ClusterShape shape;
  shape.control_keys = true;
  Cluster cluster(shape);  // every node registered over CURVE
  auto served = cluster.post("/v1/completions", {{"prompt", "hello there"}, {"max_tokens", 4}});
  ASSERT_TRUE(served.is_ok());
  EXPECT_EQ(served->status, 200) << served->body;

  // In the clear.
  EXPECT_FALSE(router_answers(cluster, "intruder-plain", nullptr));
  // Over CURVE with the router's public key but a node key of its own.
  const auto stranger_dir = cluster.dir() / "stranger-keys";
  ASSERT_TRUE(control::write_curve_keys(stranger_dir, control::KeyRing::kControl).is_ok());
  auto cluster_keys = control::read_curve_keys(cluster.dir() / "keys", control::KeyRing::kControl);
  auto stranger_keys = control::read_curve_keys(stranger_dir, control::KeyRing::kControl);
  ASSERT_TRUE(cluster_keys.is_ok() && stranger_keys.is_ok());
  control::CurveKeys forged = *stranger_keys;
  forged.server.public_key = cluster_keys->server.public_key;
  EXPECT_FALSE(router_answers(cluster, "intruder-curve", &forged));
  // With the cluster's keys the router hears it, and refuses the unknown
  // name (so the checks above can fail).
  EXPECT_TRUE(router_answers(cluster, "extra-node", &*cluster_keys));
}

TEST(ControlKeysTest, KeysAreCheckedWhenRead) {
  const auto dir =
      std::filesystem::temp_directory_path() /
      ("baton-keys-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}()));
  ASSERT_TRUE(control::write_curve_keys(dir, control::KeyRing::kControl).is_ok());
  EXPECT_FALSE(
      control::write_curve_keys(dir, control::KeyRing::kControl).is_ok());  // never overwrites
  ASSERT_TRUE(control::read_curve_keys(dir, control::KeyRing::kControl).is_ok());
  EXPECT_EQ(
      std::filesystem::status(dir / "node.key").permissions() & std::filesystem::perms::others_read,
      std::filesystem::perms::none);
  // A public key that is not the secret key's.
  std::filesystem::copy_file(dir / "router.pub", dir / "node.pub",
                             std::filesystem::copy_options::overwrite_existing);
  auto mismatched = control::read_curve_keys(dir, control::KeyRing::kControl);
  ASSERT_FALSE(mismatched.is_ok());
  EXPECT_NE(mismatched.status().message().find("node.pub is not the public key"), std::string::npos)
      << mismatched.status().message();
  std::ofstream(dir / "router.key") << "short\n";
  auto garbage = control::read_curve_keys(dir, control::KeyRing::kControl);
  ASSERT_FALSE(garbage.is_ok());
  EXPECT_NE(garbage.status().message().find("router.key"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace baton::testing

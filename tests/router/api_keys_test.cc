// API keys: which routes they guard, the Bearer form, the key file.
#include "router/api_keys.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

namespace baton::router {
namespace {

TEST(ApiKeys, GuardTheV1RoutesOnlyAndWantTheExactBearerKey) {
  const ApiKeys none;
  EXPECT_TRUE(none.admits("/v1/completions", ""));
  const ApiKeys keys({"sk-one", "sk-two"});
  for (const char* path : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/nodes"}) {
    EXPECT_FALSE(keys.admits(path, "")) << path;
    EXPECT_FALSE(keys.admits(path, "sk-one")) << path;  // no "Bearer "
    EXPECT_FALSE(keys.admits(path, "Bearer sk-on")) << path;
    EXPECT_FALSE(keys.admits(path, "Bearer sk-one ")) << path;
    EXPECT_FALSE(keys.admits(path, "bearer sk-one")) << path;
    EXPECT_FALSE(keys.admits(path, "Bearer sk-three")) << path;
    EXPECT_TRUE(keys.admits(path, "Bearer sk-one")) << path;
    EXPECT_TRUE(keys.admits(path, "Bearer sk-two")) << path;
  }
  for (const char* path : {"/health", "/metrics", "/tokenize", "/detokenize"}) {
    EXPECT_TRUE(keys.admits(path, "")) << path;
  }
}

TEST(ApiKeys, ConstantTimeEqualIsEquality) {
  std::mt19937 rng(std::random_device{}());
  for (int i = 0; i < 2000; ++i) {
    std::string a(rng() % 6, 'a'), b(rng() % 6, 'a');
    for (auto& c : a) c = char('a' + rng() % 3);
    for (auto& c : b) c = char('a' + rng() % 3);
    EXPECT_EQ(constant_time_equal(a, b), a == b) << a << " " << b;
  }
}

TEST(ApiKeys, KeyFileAndEnvironment) {
  const auto file = std::filesystem::temp_directory_path() /
                    ("baton-keys-" + std::to_string(::getpid()) + ".txt");
  std::ofstream(file) << "# keys\n\n  sk-file-one  \nsk-file-two\r\n";
  ::setenv(kApiKeyEnvironment, "sk-env", 1);
  auto keys = ApiKeys::load(file);
  ::unsetenv(kApiKeyEnvironment);
  ASSERT_TRUE(keys.is_ok()) << keys.status().to_string();
  EXPECT_EQ(keys->first(), "sk-env");
  for (const char* key : {"sk-env", "sk-file-one", "sk-file-two"}) {
    EXPECT_TRUE(keys->admits("/v1/models", std::string("Bearer ") + key)) << key;
  }
  EXPECT_FALSE(keys->admits("/v1/models", "Bearer # keys"));

  std::ofstream(file) << "# only a comment\n";
  auto empty = ApiKeys::load(file);
  ASSERT_FALSE(empty.is_ok());
  EXPECT_NE(empty.status().message().find("holds no key"), std::string::npos);
  std::filesystem::remove(file);
  auto missing = ApiKeys::load(file);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find(file.string()), std::string::npos);
  auto open = ApiKeys::load({});
  ASSERT_TRUE(open.is_ok());
  EXPECT_FALSE(open->required());
}

// A key file that is no file (a device, a directory) is refused naming the
// setting, not read without end.
TEST(ApiKeys, AKeyFileThatIsNotARegularFileIsRefused) {
  for (const char* path : {"/dev/zero", "/"}) {
    auto keys = ApiKeys::load(path);
    ASSERT_FALSE(keys.is_ok()) << path;
    EXPECT_NE(keys.status().message().find(std::string("router.api_key_file: ") + path),
              std::string::npos)
        << keys.status().message();
  }
}

}  // namespace
}  // namespace baton::router

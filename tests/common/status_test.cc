#include "common/status.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("not positive: " + std::to_string(v));
  return v;
}

Result<int> doubled(int v) {
  BATON_ASSIGN_OR_RETURN(int x, parse_positive(v));
  return 2 * x;
}

Status check_all(int a, int b) {
  BATON_RETURN_IF_ERROR(parse_positive(a).status());
  BATON_RETURN_IF_ERROR(parse_positive(b).status());
  return Status::ok();
}

TEST(Status, OkAndErrors) {
  EXPECT_TRUE(Status::ok().is_ok());
  Status s = data_loss("truncated").with_context("model.safetensors");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "model.safetensors: truncated");
  EXPECT_EQ(s.to_string(), "DATA_LOSS: model.safetensors: truncated");
}

TEST(Status, ResultPropagates) {
  EXPECT_EQ(doubled(4).value(), 8);
  auto bad = doubled(-1);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "not positive: -1");
  EXPECT_TRUE(check_all(1, 2).is_ok());
  EXPECT_EQ(check_all(1, 0).message(), "not positive: 0");
}

}  // namespace
}  // namespace baton

// The router's Prometheus text: what nodes report reaches it escaped.
#include "router/metrics.h"

#include <gtest/gtest.h>

#include <string>

namespace baton::router {
namespace {

// The transfer path each prefill node reports for each decode node is a
// label of baton:kv_transfer_path_info; a node's text can carry quotes,
// backslashes and newlines, which the text format must escape (a raw
// newline would end the sample and start a line of the node's making).
TEST(RouterMetrics, TransferPathsAreLabelsWithTheirTextEscaped) {
  ClusterSnapshot snapshot;
  NodeState prefill;
  prefill.name = "prefill-0";
  prefill.role = Role::kPrefill;
  prefill.up = true;
  prefill.kv_paths = {{"decode-0", "tag over tcp"},
                      {"decode-1", "rma \"x\" \\ y\nbaton:node_up{node=\"z\"} 1"}};
  NodeState down = prefill;
  down.name = "prefill-1";
  down.up = false;  // its last heartbeat's paths are stale
  snapshot.nodes = {prefill, down};
  const std::string text = RouterMetrics("m").render(snapshot);
  EXPECT_NE(text.find("baton:kv_transfer_path_info{node=\"prefill-0\",peer=\"decode-0\","
                      "path=\"tag over tcp\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("baton:kv_transfer_path_info{node=\"prefill-0\",peer=\"decode-1\","
                      "path=\"rma \\\"x\\\" \\\\ y\\nbaton:node_up{node=\\\"z\\\"} 1\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("node=\"prefill-1\",peer"), std::string::npos) << text;
  EXPECT_EQ(text.find("\nbaton:node_up{node=\"z\"}"), std::string::npos) << text;
}

}  // namespace
}  // namespace baton::router

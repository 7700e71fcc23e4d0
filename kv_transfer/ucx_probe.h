// kv_transfer/ucx_probe.h — what UCX chose: transports and whether RMA is native.
//
// UCX 1.13 has no query for an endpoint's transports, so we read what UCX
// itself prints: ucp_context_print_info (the resources the context will use)
// and ucp_ep_print_info (the endpoint's lane table, with each lane's roles:
// "am", "rma", "rma_bw", ...). A lane with an RMA role means puts go to the
// hardware/transport directly; without one UCX emulates puts over active
// messages ("rma_am"), which is several times slower than its rendezvous.
#pragma once

#include <ucp/api/ucp.h>

#include <string>
#include <vector>

namespace baton::kv_transfer {

struct EndpointCaps {
  std::vector<std::string> transports;  // "tcp/lo", "posix/memory", ... one per lane
  bool native_rma = false;              // some lane serves RMA
  std::string lane_table;               // UCX's own text, for debug logs
};

// Parses the text ucp_ep_print_info writes (exposed for tests).
EndpointCaps parse_endpoint_info(const std::string& text);
EndpointCaps probe_endpoint(ucp_ep_h ep);

// "self/memory0 tcp/lo posix/memory ..." from ucp_context_print_info.
std::vector<std::string> context_transports(ucp_context_h context);

}  // namespace baton::kv_transfer

// kv_transfer/ucx_probe.h — what UCX chose: transports and whether RMA is native.
//
// UCX 1.13 has no query for an endpoint's transports, so we read what UCX
// itself prints: ucp_context_print_info (the resources the context will use)
// and ucp_ep_print_info (the endpoint's lane table: each lane's transport and
// remote memory domain, and a "put[N]" protocol line per RMA lane N).
//
// A put is native only if an RMA lane's memory domain can register the
// remote pool, i.e. user memory: UCX resolves the rkey against the RMA lanes'
// domains and, finding none, emulates the put over active messages ("rma_am").
// Over TCP there is no RMA lane at all; over shared memory the RMA lanes are
// posix/sysv, whose domains only map memory they allocated themselves, so a
// put into a KV pool is emulated there too — unless the peer's pool came from
// those domains (TransferEngine::create without a pool): then its rkey maps
// into our address space (ucp_rkey_ptr succeeds) and the engine's put is a
// memcpy into it, whatever lanes the endpoint got. Which domains register is asked of UCT
// (uct_md_query: UCT_MD_FLAG_REG), not read from a list of names.
#pragma once

#include <ucp/api/ucp.h>

#include <string>
#include <vector>

namespace baton::kv_transfer {

struct EndpointCaps {
  std::vector<std::string> transports;   // "tcp/lo", "posix/memory", ... one per lane
  std::vector<std::string> rma_domains;  // memory domains of the RMA lanes ("posix")
  bool native_rma = false;               // an RMA lane's domain registers user memory
  std::string lane_table;                // UCX's own text, for debug logs
};

// Parses the text ucp_ep_print_info writes (exposed for tests);
// `registering_domains` are the memory domains that register user memory.
EndpointCaps parse_endpoint_info(const std::string& text,
                                 const std::vector<std::string>& registering_domains);
EndpointCaps probe_endpoint(ucp_ep_h ep, const std::vector<std::string>& registering_domains);

// UCT memory-domain components able to register host memory ("cma", "ib"...).
std::vector<std::string> domains_registering_host_memory();

// "self/memory0 tcp/lo posix/memory ..." from ucp_context_print_info.
std::vector<std::string> context_transports(ucp_context_h context);

}  // namespace baton::kv_transfer

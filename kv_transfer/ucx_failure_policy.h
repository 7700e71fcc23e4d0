// kv_transfer/ucx_failure_policy.h — a dead peer fails transfers, not the node.
//
// A UCX transport that sees its peer fail (a shared-memory copy from a process
// that has exited, a reset connection) hands the error to the endpoint's error
// handler. Where none took it — shared-memory transports offer no peer-failure
// handling in UCX 1.13, so their endpoints run without one — the transport
// logs at UCX's fatal level, and UCX's default log handler aborts the process
// on that level. The failing operation has already been given an error status
// by then, which fails its transfer; Baton's deadlines and acks handle the
// rest. So these messages are logged as errors instead, and the node lives.
#pragma once

namespace baton::kv_transfer {

// Installs, once per process, a UCX log handler that turns fatal-level
// messages of UCX's transport layer (functions named uct_*) into errors in
// Baton's log: every transport whose endpoint runs without peer error
// handling (shared memory always with UCX 1.13; TCP and InfiniBand where
// `peer_error_handling` is off). Fatal messages from elsewhere, and UCX's
// own assertions and `ucs_fatal` (which never pass through log handlers),
// still abort. The failed endpoint is not reported to the engine; a sender
// that is still alive finds its transfers failing and rebuilds its endpoint
// after the deadline, as after a lost ack.
void survive_transport_failures();

}  // namespace baton::kv_transfer

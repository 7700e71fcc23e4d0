// kv_transfer/ucx_handles.h — RAII owners for UCX handles and UCX-call checking.
//
// Every UCX call that returns ucs_status_t goes through BATON_UCX, which turns
// a failure into a Status naming the call, file and line. Every handle lives in
// a unique_ptr with a deleter, so no error path leaks a context, worker,
// registration, rkey or packed buffer. Endpoints are different: closing one is
// itself an asynchronous operation, see close_endpoint().
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace baton::kv_transfer {

// A Status for a failed UCX call: "ucp_put_nbx(...) failed: Connection reset".
Status ucx_error(const char* call, ucs_status_t status, const char* file, int line);

#define BATON_UCX(call)                                                              \
  do {                                                                               \
    ucs_status_t baton_ucs_ = (call);                                                \
    if (baton_ucs_ != UCS_OK) {                                                      \
      return ::baton::kv_transfer::ucx_error(#call, baton_ucs_, __FILE__, __LINE__); \
    }                                                                                \
  } while (0)

// Maps a UCX failure to the StatusCode a caller can act on.
StatusCode ucx_status_code(ucs_status_t status);

struct UcpConfigDeleter {
  void operator()(ucp_config_t* c) const { ucp_config_release(c); }
};
struct UcpContextDeleter {
  void operator()(ucp_context* c) const { ucp_cleanup(c); }
};
struct UcpWorkerDeleter {
  void operator()(ucp_worker* w) const { ucp_worker_destroy(w); }
};
struct RkeyDeleter {
  void operator()(ucp_rkey* k) const { ucp_rkey_destroy(k); }
};
struct RkeyBufferDeleter {
  void operator()(void* b) const { ucp_rkey_buffer_release(b); }
};

using UcpConfigPtr = std::unique_ptr<ucp_config_t, UcpConfigDeleter>;
using UcpContextPtr = std::unique_ptr<ucp_context, UcpContextDeleter>;
using UcpWorkerPtr = std::unique_ptr<ucp_worker, UcpWorkerDeleter>;
using RkeyPtr = std::unique_ptr<ucp_rkey, RkeyDeleter>;
using RkeyBufferPtr = std::unique_ptr<void, RkeyBufferDeleter>;

// A memory registration; unmapped (ucp_mem_unmap) with its context still alive.
class MemRegistration {
 public:
  MemRegistration() = default;
  MemRegistration(ucp_context_h context, ucp_mem_h mem) : context_(context), mem_(mem) {}
  MemRegistration(MemRegistration&& o) noexcept;
  MemRegistration& operator=(MemRegistration&& o) noexcept;
  ~MemRegistration();
  ucp_mem_h get() const { return mem_; }

 private:
  ucp_context_h context_ = nullptr;
  ucp_mem_h mem_ = nullptr;
};

// This worker's address, released back to the worker that made it.
class WorkerAddress {
 public:
  WorkerAddress() = default;
  WorkerAddress(ucp_worker_h worker, ucp_address_t* address, size_t length)
      : worker_(worker), address_(address), length_(length) {}
  WorkerAddress(WorkerAddress&& o) noexcept;
  WorkerAddress& operator=(WorkerAddress&& o) noexcept;
  ~WorkerAddress();
  std::vector<uint8_t> bytes() const;

 private:
  ucp_worker_h worker_ = nullptr;
  ucp_address_t* address_ = nullptr;
  size_t length_ = 0;
};

// Builds a UCP config from the node's UCX variables ("UCX_TLS" -> "tcp").
Result<UcpConfigPtr> read_ucp_config(const std::vector<std::pair<std::string, std::string>>& env);

// Closes `ep` with a nonblocking close and progresses `worker` until it is done
// or `timeout` passes; FORCE mode cancels whatever is still in flight. Never
// blocks longer than `timeout`. A null ep is a no-op.
Status close_endpoint(ucp_worker_h worker, ucp_ep_h ep, bool force,
                      std::chrono::milliseconds timeout);

}  // namespace baton::kv_transfer

#include "kv_transfer/ucx_handles.h"

#include <string>
#include <utility>

namespace baton::kv_transfer {

StatusCode ucx_status_code(ucs_status_t status) {
  switch (status) {
    case UCS_ERR_TIMED_OUT:
      return StatusCode::kDeadlineExceeded;
    case UCS_ERR_CANCELED:
      return StatusCode::kAborted;
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
      return StatusCode::kResourceExhausted;
    case UCS_ERR_INVALID_PARAM:
      return StatusCode::kInvalidArgument;
    case UCS_ERR_UNSUPPORTED:
      return StatusCode::kUnimplemented;
    case UCS_ERR_ENDPOINT_TIMEOUT:  // what UCX reports for a peer that went away
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_BUSY:
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kInternal;
  }
}

Status ucx_error(const char* call, ucs_status_t status, const char* file, int line) {
  std::string where = file;
  auto slash = where.rfind("kv_transfer/");
  if (slash != std::string::npos) where = where.substr(slash);
  return Status(ucx_status_code(status), std::string(call) +
                                             " failed: " + ucs_status_string(status) + " (" +
                                             where + ":" + std::to_string(line) + ")");
}

MemRegistration::MemRegistration(MemRegistration&& o) noexcept
    : context_(std::exchange(o.context_, nullptr)), mem_(std::exchange(o.mem_, nullptr)) {}

MemRegistration& MemRegistration::operator=(MemRegistration&& o) noexcept {
  if (this != &o) {
    this->~MemRegistration();
    context_ = std::exchange(o.context_, nullptr);
    mem_ = std::exchange(o.mem_, nullptr);
  }
  return *this;
}

MemRegistration::~MemRegistration() {
  if (mem_ != nullptr) ucp_mem_unmap(context_, mem_);
  mem_ = nullptr;
}

WorkerAddress::WorkerAddress(WorkerAddress&& o) noexcept
    : worker_(std::exchange(o.worker_, nullptr)),
      address_(std::exchange(o.address_, nullptr)),
      length_(std::exchange(o.length_, 0)) {}

WorkerAddress& WorkerAddress::operator=(WorkerAddress&& o) noexcept {
  if (this != &o) {
    this->~WorkerAddress();
    worker_ = std::exchange(o.worker_, nullptr);
    address_ = std::exchange(o.address_, nullptr);
    length_ = std::exchange(o.length_, 0);
  }
  return *this;
}

WorkerAddress::~WorkerAddress() {
  if (address_ != nullptr) ucp_worker_release_address(worker_, address_);
  address_ = nullptr;
}

std::vector<uint8_t> WorkerAddress::bytes() const {
  auto* p = reinterpret_cast<const uint8_t*>(address_);
  return std::vector<uint8_t>(p, p + length_);
}

Result<UcpConfigPtr> read_ucp_config(const std::vector<std::pair<std::string, std::string>>& env) {
  ucp_config_t* raw = nullptr;
  BATON_UCX(ucp_config_read(nullptr, nullptr, &raw));
  UcpConfigPtr config(raw);
  for (const auto& [key, value] : env) {
    // ucp_config_modify takes names without the UCX_ prefix.
    std::string name = key.substr(4);
    ucs_status_t status = ucp_config_modify(config.get(), name.c_str(), value.c_str());
    if (status != UCS_OK) {
      return invalid_argument("UCX setting " + key + "=" + value +
                              " rejected: " + ucs_status_string(status));
    }
  }
  return config;
}

Status close_endpoint(ucp_worker_h worker, ucp_ep_h ep, bool force,
                      std::chrono::milliseconds timeout) {
  if (ep == nullptr) return Status::ok();
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
  if (request == nullptr) return Status::ok();
  if (UCS_PTR_IS_ERR(request)) {
    // An endpoint already in error closes with its error; it is gone either way.
    return Status::ok();
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  ucs_status_t status = UCS_INPROGRESS;
  while ((status = ucp_request_check_status(request)) == UCS_INPROGRESS) {
    ucp_worker_progress(worker);
    if (std::chrono::steady_clock::now() > deadline) {
      // Leave the request to UCX: it finishes (or is cancelled) on a later
      // progress call or at worker destruction; never block past the bound.
      ucp_request_free(request);
      return deadline_exceeded("closing a UCX endpoint took longer than " +
                               std::to_string(timeout.count()) + " ms");
    }
  }
  ucp_request_free(request);
  return Status::ok();
}

}  // namespace baton::kv_transfer

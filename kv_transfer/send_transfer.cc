#include "kv_transfer/send_transfer.h"

#include <string>

#include "common/check.h"

namespace baton::kv_transfer {

void SendTransfer::start_flush() {
  BATON_CHECK(phase_ == Phase::kPosting);
  phase_ = Phase::kFlushing;
}

void SendTransfer::notice_out() {
  BATON_CHECK(phase_ == Phase::kFlushing);
  phase_ = Phase::kAwaitingAck;
}

void SendTransfer::acked(const Status& verdict, uint64_t transfer_id) {
  BATON_CHECK(phase_ == Phase::kAwaitingAck);
  phase_ = Phase::kAcked;
  if (!verdict.is_ok()) {
    fail(Status(verdict.code(), "receiver rejected transfer " + std::to_string(transfer_id)));
  }
}

void SendTransfer::fail(Status why, bool cancelled) {
  if (failed()) return;
  failure_ = std::move(why);
  cancelled_ = cancelled;
}

}  // namespace baton::kv_transfer

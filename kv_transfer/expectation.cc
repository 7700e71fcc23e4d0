#include "kv_transfer/expectation.h"

#include <algorithm>

#include "common/check.h"

namespace baton::kv_transfer {

void Expectation::accept_notice(const Notice& notice, ucp_ep* reply_ep) {
  BATON_CHECK(state_ == State::kReceiving);
  state_ = State::kNoticed;
  notice_ = notice;
  reply_ep_ = reply_ep;
}

void Expectation::start_copy_in() {
  BATON_CHECK(state_ == State::kNoticed);
  state_ = State::kCopyingIn;
}

void Expectation::conclude(Status verdict) {
  BATON_CHECK(state_ == State::kNoticed || state_ == State::kCopyingIn);
  state_ = State::kJudged;
  result_ = std::move(verdict);
}

bool Expectation::fail(Status why, bool cancelled) {
  if (!open()) return false;
  state_ = State::kFailed;
  result_ = std::move(why);
  cancelled_ = cancelled;
  return true;
}

bool Expectation::all_data_landed() const {
  if (!notice_) return false;
  return (notice_->flags & kNoticeFlagAmData) == 0 ||
         (received_bytes == expected_bytes && outstanding == 0);
}

bool Expectation::checksummed(bool verify_checksum) const {
  return verify_checksum && notice_ && (notice_->flags & kNoticeFlagNoChecksum) == 0;
}

Clock::time_point Expectation::next_timer(Clock::duration close_timeout) const {
  auto at = Clock::time_point::max();
  if (open()) at = deadline;
  if (failed() && outstanding > 0) at = std::min(at, abandon_after);
  if (awaits_puts_stopped()) at = std::min({at, abandon_after, last_grant + close_timeout});
  return at;
}

TransferMode Expectation::mode() const {
  const uint32_t flags = notice_ ? notice_->flags : 0;
  return (flags & kNoticeFlagTagData)  ? TransferMode::kTag
         : (flags & kNoticeFlagAmData) ? TransferMode::kAm
                                       : TransferMode::kRma;
}

}  // namespace baton::kv_transfer

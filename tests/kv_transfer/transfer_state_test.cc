// The two sides of a transfer as state machines, without UCX: the
// transitions the engine makes on each event, and the verdicts it reads
// from them (notice ready, blocks released, stop report owed, timers).
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "kv_transfer/expectation.h"
#include "kv_transfer/send_transfer.h"

namespace baton::kv_transfer {
namespace {

using State = Expectation::State;
using Phase = SendTransfer::Phase;
using namespace std::chrono_literals;

Notice notice_with(uint32_t flags) {
  Notice n;
  n.transfer_id = 7;
  n.bytes = 4096;
  n.flags = flags;
  return n;
}

auto* const kReplyEp = reinterpret_cast<ucp_ep*>(uintptr_t{0x1000});

TEST(ExpectationState, ANoticedTransferIsJudgedAndReleased) {
  Expectation e;
  EXPECT_TRUE(e.open());
  EXPECT_FALSE(e.all_data_landed()) << "nothing is in before the notice";
  e.accept_notice(notice_with(0), kReplyEp);
  EXPECT_EQ(e.state(), State::kNoticed);
  EXPECT_TRUE(e.open()) << "a deadline still fails a noticed transfer";
  EXPECT_EQ(e.reply_ep(), kReplyEp);
  EXPECT_FALSE(e.released());
  e.conclude(data_loss("checksum mismatch"));
  EXPECT_TRUE(e.judged());
  EXPECT_TRUE(e.released());
  EXPECT_EQ(e.result().code(), StatusCode::kDataLoss);
  EXPECT_FALSE(e.fail(deadline_exceeded("late"))) << "a verdict reached stands";
  EXPECT_EQ(e.result().code(), StatusCode::kDataLoss);
}

TEST(ExpectationState, ACopyInIsNeitherOpenNorFinal) {
  Expectation e;
  e.accept_notice(notice_with(0), kReplyEp);
  e.start_copy_in();
  EXPECT_EQ(e.state(), State::kCopyingIn);
  EXPECT_FALSE(e.open());
  EXPECT_FALSE(e.released()) << "its blocks are being written";
  EXPECT_FALSE(e.fail(Status(StatusCode::kAborted, "cancelled"), /*cancelled=*/true));
  EXPECT_FALSE(e.cancelled());
  e.conclude(Status::ok());
  EXPECT_TRUE(e.judged());
  EXPECT_TRUE(e.result().is_ok());
  EXPECT_TRUE(e.released());
}

TEST(ExpectationState, TheFirstFailureWinsAndOutstandingReceivesHoldTheBlocks) {
  Expectation e;
  e.outstanding = 2;
  ASSERT_TRUE(e.fail(Status(StatusCode::kAborted, "cancelled"), /*cancelled=*/true));
  EXPECT_TRUE(e.failed());
  EXPECT_TRUE(e.cancelled());
  EXPECT_FALSE(e.fail(deadline_exceeded("late")));
  EXPECT_EQ(e.result().code(), StatusCode::kAborted);
  EXPECT_FALSE(e.released()) << "a receive of ours may still write a block";
  e.outstanding = 0;
  EXPECT_TRUE(e.released());
}

TEST(ExpectationState, MessageDataMustAllLandButPutsAreInByTheNotice) {
  Expectation am;
  am.expected_bytes = 4096;
  am.accept_notice(notice_with(kNoticeFlagAmData), nullptr);
  EXPECT_FALSE(am.all_data_landed());
  am.received_bytes = 4096;
  am.outstanding = 1;
  EXPECT_FALSE(am.all_data_landed());
  am.outstanding = 0;
  EXPECT_TRUE(am.all_data_landed());
  EXPECT_EQ(am.mode(), TransferMode::kAm);

  Expectation put;
  put.expected_bytes = 4096;
  put.accept_notice(notice_with(0), nullptr);
  EXPECT_TRUE(put.all_data_landed());
  EXPECT_EQ(put.mode(), TransferMode::kRma);

  Expectation tagged;
  tagged.accept_notice(notice_with(kNoticeFlagAmData | kNoticeFlagTagData), nullptr);
  EXPECT_EQ(tagged.mode(), TransferMode::kTag);
}

TEST(ExpectationState, ChecksummedOnlyWhenBothSidesHashed) {
  Expectation e;
  EXPECT_FALSE(e.checksummed(true)) << "no notice yet";
  e.accept_notice(notice_with(kNoticeFlagNoChecksum), nullptr);
  EXPECT_FALSE(e.checksummed(true));
  Expectation f;
  f.accept_notice(notice_with(0), nullptr);
  EXPECT_TRUE(f.checksummed(true));
  EXPECT_FALSE(f.checksummed(false));
}

TEST(ExpectationState, AGrantedSenderHoldsAFailedReceiverUntilItsPutsStop) {
  Expectation e;
  const Clock::time_point t0 = Clock::now();
  e.deadline = t0 + 3s;
  e.abandon_after = t0 + 8s;
  EXPECT_EQ(e.next_timer(1s), e.deadline);
  e.granted = true;
  e.last_grant = t0 + 1s;
  e.fail(deadline_exceeded("late"));
  EXPECT_TRUE(e.awaits_puts_stopped());
  EXPECT_FALSE(e.released());
  EXPECT_EQ(e.next_timer(1s), t0 + 2s) << "the last grant is close_timeout old then";
  e.outstanding = 1;
  EXPECT_EQ(e.next_timer(10s), t0 + 8s) << "abandon_after comes first";
  e.outstanding = 0;
  e.puts_stopped = true;
  EXPECT_FALSE(e.awaits_puts_stopped());
  EXPECT_TRUE(e.released());
  EXPECT_EQ(e.next_timer(1s), Clock::time_point::max());

  Expectation noticed;  // the notice says the puts are in
  noticed.granted = true;
  noticed.accept_notice(notice_with(0), nullptr);
  noticed.fail(deadline_exceeded("late"));
  EXPECT_FALSE(noticed.awaits_puts_stopped());
  EXPECT_TRUE(noticed.released());
}

// Random events in random order: final states never change, the first
// result stands, and released() is never true of an unfinished transfer.
TEST(ExpectationState, RandomEventsKeepTheInvariants) {
  std::mt19937_64 rng(std::random_device{}());
  for (int round = 0; round < 2000; ++round) {
    Expectation e;
    std::optional<StatusCode> first_result;
    for (int step = 0; step < 12; ++step) {
      const State before = e.state();
      const bool was_final = e.final();
      switch (rng() % 6) {
        case 0:
          if (e.state() == State::kReceiving)
            e.accept_notice(notice_with(uint32_t(rng() % 8)), nullptr);
          break;
        case 1:
          if (e.state() == State::kNoticed) e.start_copy_in();
          break;
        case 2:
          if (e.state() == State::kNoticed || e.state() == State::kCopyingIn) {
            const auto code = rng() % 2 ? StatusCode::kOk : StatusCode::kDataLoss;
            e.conclude(Status(code, "verdict"));
            first_result = code;
          }
          break;
        case 3: {
          const bool changed = e.fail(deadline_exceeded("late"), rng() % 2 == 0);
          EXPECT_EQ(changed, before == State::kReceiving || before == State::kNoticed);
          if (changed) first_result = StatusCode::kDeadlineExceeded;
          break;
        }
        case 4:
          e.outstanding = int(rng() % 2);
          break;
        case 5:
          e.granted = rng() % 2 == 0;
          e.puts_stopped = rng() % 2 == 0;
          break;
      }
      if (was_final) {
        EXPECT_EQ(e.state(), before) << "round " << round;
      }
      if (first_result) {
        EXPECT_EQ(e.result().code(), *first_result) << "round " << round;
      }
      if (e.released()) {
        EXPECT_TRUE(e.final());
        EXPECT_EQ(e.outstanding, 0);
      }
    }
  }
}

SendTransfer send_of(TransferMode mode) {
  SendTransfer t;
  t.spec.transfer_id = 9;
  t.spec.layer_begin = 0;
  t.spec.layer_end = 4;
  t.mode = mode;
  return t;
}

TEST(SendTransferState, TheNoticeWaitsForTheFlushTheOperationsAndTheHashing) {
  SendTransfer t = send_of(TransferMode::kAm);
  EXPECT_FALSE(t.ready_for_notice());
  t.start_flush();
  EXPECT_EQ(t.phase(), Phase::kFlushing);
  t.outstanding = 1;
  t.hash_jobs = 1;
  EXPECT_FALSE(t.ready_for_notice()) << "not flushed";
  t.flush_completed();
  EXPECT_FALSE(t.ready_for_notice()) << "an operation in flight";
  t.outstanding = 0;
  EXPECT_FALSE(t.ready_for_notice()) << "the source is not hashed";
  t.hash_jobs = 0;
  EXPECT_TRUE(t.ready_for_notice());
  t.notice_out();
  EXPECT_TRUE(t.notice_sent());
  EXPECT_FALSE(t.ready_for_notice());
  EXPECT_FALSE(t.finished()) << "the ack ends it";
  t.acked(Status::ok(), 9);
  EXPECT_EQ(t.phase(), Phase::kAcked);
  EXPECT_TRUE(t.finished());
  EXPECT_FALSE(t.failed());
}

TEST(SendTransferState, ARejectingAckIsTheFailure) {
  SendTransfer t = send_of(TransferMode::kAm);
  t.start_flush();
  t.flush_completed();
  t.notice_out();
  t.outstanding = 1;  // the notice's send has not completed yet
  t.acked(data_loss("checksum mismatch"), 9);
  EXPECT_TRUE(t.failed());
  EXPECT_EQ(t.failure().code(), StatusCode::kDataLoss);
  EXPECT_NE(t.failure().message().find("receiver rejected transfer 9"), std::string::npos);
  EXPECT_FALSE(t.finished());
  t.outstanding = 0;
  EXPECT_TRUE(t.finished());
}

TEST(SendTransferState, AFailedSendDrainsAndTheFirstFailureWins) {
  SendTransfer t = send_of(TransferMode::kTag);
  t.outstanding = 3;
  t.fail(Status(StatusCode::kAborted, "cancelled"), /*cancelled=*/true);
  t.fail(deadline_exceeded("late"));
  EXPECT_TRUE(t.cancelled());
  EXPECT_EQ(t.failure().code(), StatusCode::kAborted);
  EXPECT_FALSE(t.finished()) << "its operations still read the source blocks";
  t.outstanding = 0;
  EXPECT_TRUE(t.finished());
  EXPECT_FALSE(t.owes_stop_report()) << "tagged sends are not granted";
}

TEST(SendTransferState, AFailedPutSendReportsItsPutsStoppedOnlyIfGrantedAndNotNoticed) {
  SendTransfer granted = send_of(TransferMode::kRma);
  granted.granted_end = 2;
  EXPECT_FALSE(granted.owes_stop_report()) << "not failed";
  granted.fail(unavailable("peer gone"));
  EXPECT_TRUE(granted.owes_stop_report());
  granted.stop_report_flushing();
  EXPECT_TRUE(granted.owes_stop_report()) << "the report follows the flush";
  granted.stop_report_sent();
  EXPECT_FALSE(granted.owes_stop_report());

  SendTransfer never_granted = send_of(TransferMode::kRma);
  never_granted.fail(unavailable("refused"));
  EXPECT_FALSE(never_granted.owes_stop_report());

  SendTransfer noticed = send_of(TransferMode::kRma);
  noticed.granted_end = 4;
  noticed.start_flush();
  noticed.flush_completed();
  noticed.notice_out();
  noticed.fail(deadline_exceeded("no ack"));
  EXPECT_FALSE(noticed.owes_stop_report()) << "the notice says the puts are in";
}

}  // namespace
}  // namespace baton::kv_transfer

// Failure paths across ranks: a rank that never joins a collective makes the others'
// watchdog fire with a report; a configuration that differs between ranks is caught.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "strata/comm.h"
#include "strata/config.h"

namespace strata {
namespace {

std::unique_ptr<Communicator> MakeWorld(const std::string& name, double timeout_s,
                                        bool one_node_per_rank = false) {
  CommOptions o;
  o.name = name;
  o.collective_timeout_s = timeout_s;
  o.one_node_per_rank = one_node_per_rank;
  auto w = InitWorld(o);
  STRATA_CHECK_MSG(w.ok(), w.status().ToString());
  return std::move(w).value();
}

TEST(Watchdog, RankThatNeverJoinsIsReported) {
  auto control = MakeWorld("control", 60);
  auto c = MakeWorld("watched", 0.5);
  const int missing = c->size() - 1;
  ASSERT_TRUE(c->Barrier().Wait().ok());  // #1, entered and finished by everyone
  if (c->rank() != missing) {
    std::vector<float> buf(64, 1.0f);
    auto t0 = std::chrono::steady_clock::now();
    Status s = c->AllReduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::kSum).Wait();  // #2
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
    EXPECT_GE(waited, 0.5);
    EXPECT_LT(waited, 5.0) << "the watchdog should fire soon after the 0.5 s limit";
    const std::string& m = s.message();
    EXPECT_NE(m.find("#2 AllReduce f32 x64"), std::string::npos) << m;
    EXPECT_NE(m.find("'watched' (rank " + std::to_string(c->rank()) + " of " + std::to_string(c->size())),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("rank " + std::to_string(missing) + ": last entered #1 Barrier (finished)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("rank 0: last entered #2 AllReduce"), std::string::npos) << m;
    // The communicator is failed for good: later collectives say so at once.
    Status later = c->Barrier().Wait();
    EXPECT_EQ(later.code(), StatusCode::kAborted) << later.ToString();
    EXPECT_NE(later.message().find("failed earlier"), std::string::npos) << later.ToString();
  }
  // Everyone meets again on a healthy communicator, then frees the failed one together.
  ASSERT_TRUE(control->Barrier().Wait().ok());
  c.reset();
  EXPECT_TRUE(control->Barrier().Wait().ok());
}

// The board keeps the text of the previous collective when the next one is described
// the same way (it is not rewritten per call): the report must still name it.
TEST(Watchdog, RepeatedCollectiveIsReportedWithItsText) {
  auto control = MakeWorld("control", 60);
  auto c = MakeWorld("watched", 0.5);
  const int missing = c->size() - 1;
  std::vector<float> buf(64, 1.0f);
  ASSERT_TRUE(
      c->AllReduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::kSum).Wait().ok());  // #1
  if (c->rank() != missing) {
    Status s = c->AllReduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::kSum).Wait();  // #2
    EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
    const std::string& m = s.message();
    EXPECT_NE(m.find("#2 AllReduce f32 x64"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0: last entered #2 AllReduce f32 x64 (256 B) (not finished)"), std::string::npos)
        << m;
    EXPECT_NE(
        m.find("rank " + std::to_string(missing) + ": last entered #1 AllReduce f32 x64 (256 B) (finished)"),
        std::string::npos)
        << m;
  }
  ASSERT_TRUE(control->Barrier().Wait().ok());
  c.reset();
  EXPECT_TRUE(control->Barrier().Wait().ok());
}

TEST(Consistency, SameConfigPasses) {
  auto c = MakeWorld("consistency", 30);
  Config config;
  EXPECT_TRUE(CheckConsistency(*c, "config", ConfigToJson(config)).ok());
}

TEST(Consistency, MismatchNamesTheFirstDifferingKeyOnEveryRank) {
  auto c = MakeWorld("consistency", 30);
  Config config;
  if (c->rank() == 1) config.zero.stage = 3;
  if (c->rank() == c->size() - 1 && c->size() > 2)
    config.aio.queue_depth = 7;  // a later rank differs elsewhere
  Status s = CheckConsistency(*c, "config", ConfigToJson(config));
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("rank 1 has zero_optimization.stage = 3, rank 0 has 0"), std::string::npos)
      << s.message();
  std::string n_differ =
      std::to_string(c->size() > 2 ? 2 : 1) + " of " + std::to_string(c->size()) + " ranks";
  EXPECT_NE(s.message().find(n_differ), std::string::npos) << s.message();
  // The communicator is still usable: the check left nothing unmatched.
  EXPECT_TRUE(c->Barrier().Wait().ok());
}

// A rank that fails and posts it ends its peers' wait at once, not at the watchdog's
// limit (60 s here), naming itself and why; the communicator is then failed everywhere.
// `one_node_per_rank`: every rank as if on a node of its own, where the board cannot
// carry the failure and it must come as a message.
void ExpectAPostedFailureEndsThePeersWait(bool one_node_per_rank, const std::string& why) {
  auto control = MakeWorld("control", 60);
  auto c = MakeWorld("watched", 60, one_node_per_rank);
  const int failing = c->size() - 1;
  ASSERT_TRUE(c->Barrier().Wait().ok());  // #1, everyone
  // Every rank has left #1 before the failure is posted: a rank still polling #1 (the
  // failing one may finish its part first) would abandon it, rightly, on the notice.
  ASSERT_TRUE(control->Barrier().Wait().ok());
  if (c->rank() == failing) {
    c->PostFailure(why);
    // Its own later collectives end at once, without entering MPI.
    Status own = c->Barrier().Wait();
    EXPECT_EQ(own.code(), StatusCode::kAborted) << own.ToString();
    EXPECT_NE(own.message().find("this rank posted its failure"), std::string::npos) << own.ToString();
  } else {
    std::vector<float> buf(64, 1.0f);
    auto t0 = std::chrono::steady_clock::now();
    Status s = c->AllReduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::kSum).Wait();  // #2
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
    EXPECT_LT(waited, 10.0) << "ended by the watchdog (60 s), not by the posted failure";
    const std::string& m = s.message();
    EXPECT_NE(m.find("#2 AllReduce f32 x64"), std::string::npos) << m;
    EXPECT_NE(m.find("rank " + std::to_string(failing) + " failed: " + why), std::string::npos) << m;
    Status later = c->Barrier().Wait();
    EXPECT_EQ(later.code(), StatusCode::kAborted) << later.ToString();
  }
  ASSERT_TRUE(control->Barrier().Wait().ok());
  c.reset();
  EXPECT_TRUE(control->Barrier().Wait().ok());
}

TEST(Watchdog, APostedFailureEndsThePeersWaitAtOnce) {
  ExpectAPostedFailureEndsThePeersWait(false, "Fetch(2) failed (IoError: the disk went away)");
}

TEST(Watchdog, APostedFailureReachesRanksOnOtherNodes) {
  ExpectAPostedFailureEndsThePeersWait(
      true, "Step() failed (IoError: writing optimizer state: No space left on device)");
}

TEST(Consistency, LayoutArraysCompareByIndex) {
  auto c = MakeWorld("consistency", 30);
  nlohmann::json layout = {
      {"tensors", {{{"name", "w0"}, {"numel", 1024}}, {{"name", "w1"}, {"numel", 4096}}}}};
  if (c->rank() == c->size() - 1) layout["tensors"][1]["numel"] = 4095;
  Status s = CheckConsistency(*c, "model layout", layout);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("model layout mismatch"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("tensors[1].numel = 4095, rank 0 has 4096"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace strata

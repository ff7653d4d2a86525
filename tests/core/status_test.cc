#include "strata/status.h"

#include <gtest/gtest.h>

#include <cerrno>

#include "strata/log.h"

namespace strata {
namespace {

Status Fails() { return IoError("read of swap.0 at offset 4096 failed"); }
Status Propagates() {
  STRATA_RETURN_IF_ERROR(Fails());
  return InternalError("not reached");
}
Result<int> Half(int x) {
  if (x % 2) return InvalidArgumentError("odd: " + std::to_string(x));
  return x / 2;
}
Result<int> Quarter(int x) {
  STRATA_ASSIGN_OR_RETURN(int h, Half(x));
  STRATA_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(Status, OkAndErrors) {
  EXPECT_TRUE(OkStatus().ok());
  EXPECT_EQ(OkStatus().ToString(), "OK");
  Status s = OutOfBudgetError("device tier: 8 GiB budget");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOutOfBudget);
  EXPECT_EQ(s.ToString(), "OutOfBudget: device tier: 8 GiB budget");
  EXPECT_EQ(s.WithContext("acquire chunk 3").message(), "acquire chunk 3: device tier: 8 GiB budget");
}

TEST(Status, MacrosPropagate) {
  EXPECT_EQ(Propagates().code(), StatusCode::kIoError);
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Quarter(6).status().message(), "odd: 3");
}

TEST(Status, ErrnoMapping) {
  Status s = ErrnoError(ENOSPC, "write swap.0");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("No space left"), std::string::npos);
  EXPECT_NE(s.message().find("errno 28"), std::string::npos);
  EXPECT_EQ(ErrnoError(ENOENT, "open").code(), StatusCode::kNotFound);
  EXPECT_EQ(ErrnoError(EIO, "read").code(), StatusCode::kIoError);
  EXPECT_EQ(ErrnoError(EPERM, "io_uring_setup").code(), StatusCode::kUnavailable);
}

TEST(StatusDeathTest, ValueOfFailedResultAborts) {
  Result<int> r = NotFoundError("no such chunk");
  EXPECT_DEATH((void)r.value(), "no such chunk");
}

std::vector<std::string>* captured = nullptr;
void Capture(LogLevel, std::string_view sub, const std::string& msg) {
  captured->push_back(std::string(sub) + ":" + msg);
}

TEST(Log, LevelsPerSubsystem) {
  std::vector<std::string> lines;
  captured = &lines;
  SetLogSink(&Capture);
  ASSERT_TRUE(ConfigureLogging("warn,io=debug").ok());
  STRATA_LOG(kInfo, "tier") << "hidden";
  STRATA_LOG(kWarn, "tier") << "shown " << 1;
  STRATA_LOG(kDebug, "io") << "io debug";
  STRATA_LOG(kTrace, "io") << "hidden too";
  SetLogSink(nullptr);
  ASSERT_TRUE(ConfigureLogging("info").ok());
  EXPECT_EQ(lines, (std::vector<std::string>{"tier:shown 1", "io:io debug"}));
}

TEST(Log, BadSpecIsAnError) {
  Status s = ConfigureLogging("info,io=loud");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("loud"), std::string::npos);
  EXPECT_FALSE(ConfigureLogging("=debug").ok());
  ASSERT_TRUE(ConfigureLogging("info").ok());
}

}  // namespace
}  // namespace strata

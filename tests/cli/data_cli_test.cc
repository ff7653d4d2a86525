// `strata data prepare` and `strata data info` as a user meets them: what a prepare run
// prints and writes, and refusals that name the file and exit 1.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli/cli_runner.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using testing::CliRun;
using ::testing::HasSubstr;
using testing::RunStrata;

class DataCli : public testing::ScratchDirTest {
 protected:
  DataCli() : ScratchDirTest("strata-data-cli-test-") {}

  std::string WriteText(const std::string& name, size_t bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream out(path, std::ios::binary);
    const std::string line = "The quick brown fox jumps over the lazy dog.\n";
    for (size_t n = 0; n < bytes; n += line.size()) out << line.substr(0, std::min(line.size(), bytes - n));
    return path;
  }
};

TEST_F(DataCli, PrepareWritesTrainAndValidationAndInfoReadsThem) {
  const std::string a = WriteText("a.txt", 30000), b = WriteText("b.txt", 10000);
  const std::string out = (dir_ / "tokens").string();
  CliRun r = RunStrata({"data", "prepare", a, b, "--out", out, "--validation", "0.1"});
  ASSERT_EQ(r.exit_status, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("2 input files"));
  EXPECT_THAT(r.out, HasSubstr("40000 bytes"));
  EXPECT_THAT(r.out, AllOf(HasSubstr(out + "/train.tokens"), HasSubstr("36000"), HasSubstr("90.0%")));
  EXPECT_THAT(r.out, AllOf(HasSubstr(out + "/val.tokens"), HasSubstr("4000"), HasSubstr("10.0%")));
  EXPECT_EQ(fs::file_size(out + "/train.tokens"), 64u + 2 * 36000);
  EXPECT_EQ(fs::file_size(out + "/val.tokens"), 64u + 2 * 4000);

  r = RunStrata({"data", "info", out + "/val.tokens"});
  ASSERT_EQ(r.exit_status, 0) << r.out << r.err;
  EXPECT_THAT(r.out,
              AllOf(HasSubstr("version 1"), HasSubstr("256"), HasSubstr("4000"), HasSubstr("8064 bytes")));
}

TEST_F(DataCli, MissingInputFileIsRefusedByName) {
  const std::string a = WriteText("a.txt", 30000), missing = (dir_ / "no-such.txt").string();
  const std::string out = (dir_ / "tokens").string();
  CliRun r = RunStrata({"data", "prepare", a, missing, "--out", out});
  EXPECT_EQ(r.exit_status, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("strata: error:"), HasSubstr(missing), HasSubstr("does not exist")));
  EXPECT_FALSE(fs::exists(out + "/train.tokens"));
}

TEST_F(DataCli, InfoRefusesABadFileByName) {
  const std::string bogus = (dir_ / "bogus.tokens").string();
  std::ofstream(bogus) << "this is text, not a token file, and longer than the sixty-four byte header is";
  CliRun r = RunStrata({"data", "info", bogus});
  EXPECT_EQ(r.exit_status, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr(bogus), HasSubstr("not a strata token file")));
  r = RunStrata({"data", "info", (dir_ / "absent.tokens").string()});
  EXPECT_EQ(r.exit_status, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("absent.tokens"), HasSubstr("does not exist")));
}

}  // namespace
}  // namespace strata

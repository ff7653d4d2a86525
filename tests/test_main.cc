// Shared GoogleTest entry point: lets STRATA_LOG configure logging before tests run.
#include <gtest/gtest.h>

#include "strata/log.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  strata::InitLoggingFromEnv();
  return RUN_ALL_TESTS();
}

#include "common/logging.h"

#include "common/testing/log_capture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::ElementsAre;

TEST(LoggingTest, SinkReceivesMessagesAtOrAboveTheMinimumLevel) {
  const LogLevel saved = MinLogLevel();
  SetMinLogLevel(LogLevel::kWarning);
  {
    testing::ScopedLogCapture capture;
    ZO_LOG(INFO) << "dropped " << 1;
    ZO_LOG(WARNING) << "unknown key '"
                    << "foo"
                    << "'";
    ZO_LOG(ERROR) << "bad";
    EXPECT_THAT(capture.lines(), ElementsAre("WARNING: unknown key 'foo'", "ERROR: bad"));
  }
  SetMinLogLevel(saved);
}

TEST(LoggingTest, DroppedMessagesAreNotFormatted) {
  const LogLevel saved = MinLogLevel();
  SetMinLogLevel(LogLevel::kError);
  int evaluated = 0;
  auto touch = [&] { return ++evaluated; };
  ZO_LOG(DEBUG) << touch();
  EXPECT_EQ(evaluated, 0);
  SetMinLogLevel(saved);
}

}  // namespace
}  // namespace zo

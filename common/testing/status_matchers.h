// gMock matchers for absl::Status / absl::StatusOr (our Abseil has none).
//
//   EXPECT_THAT(LoadConfig(text), StatusIs(absl::StatusCode::kInvalidArgument,
//                                          HasSubstr("optimizer.params.lr")));
//   ASSERT_THAT(result, IsOk());
#ifndef ZO_COMMON_TESTING_STATUS_MATCHERS_H_
#define ZO_COMMON_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace zo::testing {
namespace status_matchers_internal {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }

template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

}  // namespace status_matchers_internal

MATCHER(IsOk, "is OK") {
  const absl::Status& status = status_matchers_internal::GetStatus(arg);
  if (!status.ok()) *result_listener << "status is " << status;
  return status.ok();
}

MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + absl::StatusCodeToString(code) + " and a message that " +
               ::testing::DescribeMatcher<std::string>(message_matcher)) {
  const absl::Status& status = status_matchers_internal::GetStatus(arg);
  *result_listener << "status is " << status;
  return status.code() == code &&
         ::testing::Matches(message_matcher)(std::string(status.message()));
}

// A StatusOr that is OK and holds `value` (a value or a matcher).
MATCHER_P(IsOkAndHolds, value, "is OK and holds " + ::testing::PrintToString(value)) {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(value, *arg, result_listener);
}

}  // namespace zo::testing

#define ZO_ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  ZO_ASSERT_OK_AND_ASSIGN_IMPL_(ZO_TESTING_CONCAT_(zo_statusor_, __LINE__), lhs, rexpr)
#define ZO_TESTING_CONCAT_INNER_(x, y) x##y
#define ZO_TESTING_CONCAT_(x, y) ZO_TESTING_CONCAT_INNER_(x, y)
#define ZO_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  ASSERT_TRUE(statusor.ok()) << statusor.status();          \
  lhs = std::move(statusor).value()

#endif  // ZO_COMMON_TESTING_STATUS_MATCHERS_H_

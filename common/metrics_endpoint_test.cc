#include "common/metrics_endpoint.h"

#include <atomic>
#include <memory>
#include <vector>

#include "common/testing/http_get.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::HttpGet;
using ::zo::testing::IsOk;
using ::zo::testing::ScrapeValue;
using ::zo::testing::StatusIs;

// A gauge whose value the test sets: what a scrape must show at that moment.
class OneGauge : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    prometheus::MetricFamily family{
        "zo_test_value", "a value the test sets", prometheus::MetricType::Gauge, {}};
    prometheus::ClientMetric metric;
    metric.label.push_back({"job", "a"});
    metric.gauge.value = value.load();
    family.metric.push_back(metric);
    return {family};
  }
  std::atomic<double> value{0};
};

TEST(MetricsEndpointTest, AScrapeShowsTheValueOfTheMoment) {
  auto gauge = std::make_shared<OneGauge>();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0", {gauge});
  ASSERT_THAT(endpoint, IsOk());
  EXPECT_GT((*endpoint)->port(), 0);
  EXPECT_EQ((*endpoint)->url(),
            "http://127.0.0.1:" + std::to_string((*endpoint)->port()) + "/metrics");

  for (double v : {1.5, 42.0}) {
    gauge->value = v;
    absl::StatusOr<testing::HttpResponse> got = HttpGet((*endpoint)->port(), "/metrics");
    ASSERT_THAT(got, IsOk());
    EXPECT_EQ(got->status, 200);
    EXPECT_THAT(got->content_type, HasSubstr("text/plain"));
    EXPECT_THAT(got->body, HasSubstr("# TYPE zo_test_value gauge"));
    absl::StatusOr<double> seen = ScrapeValue(got->body, "zo_test_value", {"job=\"a\""});
    ASSERT_THAT(seen, IsOk());
    EXPECT_EQ(*seen, v);
  }
}

TEST(MetricsEndpointTest, APortInUseIsUnavailableNamingTheAddress) {
  auto gauge = std::make_shared<OneGauge>();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> first =
      MetricsEndpoint::Start("127.0.0.1:0", {gauge});
  ASSERT_THAT(first, IsOk());
  const std::string taken = "127.0.0.1:" + std::to_string((*first)->port());
  EXPECT_THAT(MetricsEndpoint::Start(taken, {gauge}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(taken)));
  // The first one still serves.
  EXPECT_THAT(HttpGet((*first)->port(), "/metrics"), IsOk());
}

TEST(MetricsEndpointTest, OtherPathsAndMethodsAreRefused) {
  auto gauge = std::make_shared<OneGauge>();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0", {gauge});
  ASSERT_THAT(endpoint, IsOk());
  absl::StatusOr<testing::HttpResponse> other = HttpGet((*endpoint)->port(), "/secrets");
  ASSERT_THAT(other, IsOk());
  EXPECT_EQ(other->status, 404);
  EXPECT_THAT(other->body, HasSubstr("/metrics"));
  // A request that is not a GET gets an error, and the endpoint keeps serving.
  absl::StatusOr<testing::HttpResponse> bad =
      testing::HttpRequest((*endpoint)->port(), "BREW /pot HTTP/1.0\r\n\r\n");
  ASSERT_THAT(bad, IsOk());
  EXPECT_EQ(bad->status, 405);
  absl::StatusOr<testing::HttpResponse> after = HttpGet((*endpoint)->port(), "/metrics");
  ASSERT_THAT(after, IsOk());
  EXPECT_EQ(after->status, 200);
}

TEST(MetricsEndpointTest, ABadAddressIsInvalid) {
  EXPECT_THAT(MetricsEndpoint::Start("127.0.0.1:99999", {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("99999")));
  EXPECT_THAT(MetricsEndpoint::Start("no-port", {}),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(MetricsEndpoint::Start("localhost:0", {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("numeric")));
}

}  // namespace
}  // namespace zo

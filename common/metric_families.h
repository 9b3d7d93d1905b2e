// Building what a prometheus::Collectable returns at a scrape: families of
// counters and gauges with labelled samples (server/server_metrics.h,
// worker/train/train_metrics.h).
#ifndef ZO_COMMON_METRIC_FAMILIES_H_
#define ZO_COMMON_METRIC_FAMILIES_H_

#include <deque>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"
#include "prometheus/metric_type.h"

namespace zo {

// Hands out references that stay valid while more families are added.
class MetricFamilies {
 public:
  prometheus::MetricFamily& Add(std::string name, std::string help, prometheus::MetricType type) {
    families_.push_back({std::move(name), std::move(help), type, {}});
    return families_.back();
  }
  std::vector<prometheus::MetricFamily> Take() {
    return {std::make_move_iterator(families_.begin()), std::make_move_iterator(families_.end())};
  }

 private:
  std::deque<prometheus::MetricFamily> families_;
};

// One sample of `family` (a counter or a gauge, as the family says).
inline void AddSample(prometheus::MetricFamily& family,
                      std::vector<prometheus::ClientMetric::Label> labels, double value) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (family.type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  family.metric.push_back(std::move(m));
}

}  // namespace zo

#endif  // ZO_COMMON_METRIC_FAMILIES_H_

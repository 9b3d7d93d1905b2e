// A plain HTTP/1.0 GET over a loopback socket, for tests that scrape a
// metrics endpoint the way Prometheus does (no client library between).
#ifndef ZO_COMMON_TESTING_HTTP_GET_H_
#define ZO_COMMON_TESTING_HTTP_GET_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace zo::testing {

struct HttpResponse {
  int status = 0;
  std::string content_type;
  std::string body;
};

// GET http://127.0.0.1:port/path; UNAVAILABLE when nothing answers.
absl::StatusOr<HttpResponse> HttpGet(int port, const std::string& path);
// Sends `request` as it is and reads the response until the server closes.
absl::StatusOr<HttpResponse> HttpRequest(int port, const std::string& request);

// The value of the first sample of `name` whose labels contain every
// `label="value"` pair in `labels` (e.g. {"job=\"a\""}), from Prometheus
// text; NOT_FOUND when there is none.
absl::StatusOr<double> ScrapeValue(const std::string& text, const std::string& name,
                                   const std::vector<std::string>& labels = {});

}  // namespace zo::testing

#endif  // ZO_COMMON_TESTING_HTTP_GET_H_

#include "common/testing/http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace zo::testing {

absl::StatusOr<HttpResponse> HttpGet(int port, const std::string& path) {
  return HttpRequest(port, absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"));
}

absl::StatusOr<HttpResponse> HttpRequest(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("connect 127.0.0.1:", port, ": ", std::strerror(err)));
  }
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    }
    sent += static_cast<size_t>(n);
  }
  std::string raw;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    return absl::DataLossError(absl::StrCat("no HTTP header in ", raw.size(), " bytes"));
  }
  HttpResponse response;
  const std::vector<std::string> lines = absl::StrSplit(raw.substr(0, head_end), "\r\n");
  const std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
  if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &response.status)) {
    return absl::DataLossError(absl::StrCat("bad status line: ", lines[0]));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    if (absl::StartsWithIgnoreCase(lines[i], "content-type:")) {
      response.content_type = std::string(absl::StripAsciiWhitespace(lines[i].substr(13)));
    }
  }
  response.body = raw.substr(head_end + 4);
  return response;
}

absl::StatusOr<double> ScrapeValue(const std::string& text, const std::string& name,
                                   const std::vector<std::string>& labels) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == absl::string_view::npos || line.substr(0, name_end) != name) continue;
    bool match = true;
    for (const std::string& l : labels) match = match && absl::StrContains(line, l);
    if (!match) continue;
    const size_t value_at = line.rfind(' ');
    double value = 0;
    if (!absl::SimpleAtod(line.substr(value_at + 1), &value)) {
      return absl::DataLossError(absl::StrCat("bad sample: ", line));
    }
    return value;
  }
  return absl::NotFoundError(absl::StrCat("no sample ", name, " ", absl::StrJoin(labels, ",")));
}

}  // namespace zo::testing

#include "common/host_port.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using testing::StatusIs;

TEST(HostPortTest, ParsesNamesAddressesAndBracketedIPv6) {
  for (PortUse use : {PortUse::kConnect, PortUse::kListen}) {
    ZO_ASSERT_OK_AND_ASSIGN(HostPort a, ParseHostPort("localhost:50051", use));
    EXPECT_EQ(a.host, "localhost");
    EXPECT_EQ(a.port, 50051);
    ZO_ASSERT_OK_AND_ASSIGN(HostPort b, ParseHostPort("10.0.0.2:1", use));
    EXPECT_EQ(b.host, "10.0.0.2");
    EXPECT_EQ(b.port, 1);
    ZO_ASSERT_OK_AND_ASSIGN(HostPort c, ParseHostPort("[::1]:65535", use));
    EXPECT_EQ(c.host, "::1");
    EXPECT_EQ(c.port, 65535);
  }
}

TEST(HostPortTest, PortZeroOnlyListens) {
  ZO_ASSERT_OK_AND_ASSIGN(HostPort listen, ParseHostPort("127.0.0.1:0", PortUse::kListen));
  EXPECT_EQ(listen.port, 0);
  ZO_ASSERT_OK_AND_ASSIGN(HostPort any, ParseHostPort("[::]:0", PortUse::kListen));
  EXPECT_EQ(any.host, "::");
  EXPECT_THAT(ParseHostPort("127.0.0.1:0", PortUse::kConnect),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'127.0.0.1:0' is not host:port (\"[address]:port\" for IPv6) "
                                 "with a port in [1, 65535]")));
}

TEST(HostPortTest, RefusesWhatIsNotHostPort) {
  for (const char* bad : {"", "b", "127.0.0.1", ":80", "host:", "host:65536", "host:-1", "host:+80",
                          "host: 80", "host:080000", "host:8a", "::1:80", "[::1]80", "[::1]",
                          "[]:80", "a b:80", "a/b:80", "unix:/tmp/socket", "dns:///host:80"}) {
    for (PortUse use : {PortUse::kConnect, PortUse::kListen}) {
      EXPECT_THAT(ParseHostPort(bad, use),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr(std::string("'") + bad + "' is not host:port")))
          << bad;
    }
  }
}

TEST(HostPortTest, FormatBracketsIPv6AndRoundTrips) {
  EXPECT_EQ(FormatHostPort({.host = "::1", .port = 7070}), "[::1]:7070");
  EXPECT_EQ(FormatHostPort({.host = "example.org", .port = 80}), "example.org:80");
  for (const char* address : {"[fe80::1]:1", "10.1.2.3:65535", "zo-server-0.local:7070"}) {
    ZO_ASSERT_OK_AND_ASSIGN(HostPort hp, ParseHostPort(address, PortUse::kConnect));
    EXPECT_EQ(FormatHostPort(hp), address);
  }
}

}  // namespace
}  // namespace zo

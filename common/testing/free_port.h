// A loopback TCP port nothing listens on right now: the kernel's pick for
// port 0, bound and released. Another process could take it in between,
// which loopback tests accept.
#ifndef ZO_COMMON_TESTING_FREE_PORT_H_
#define ZO_COMMON_TESTING_FREE_PORT_H_

namespace zo::testing {

int FreeLoopbackPort();

}  // namespace zo::testing

#endif  // ZO_COMMON_TESTING_FREE_PORT_H_

#include "common/shared_futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>

namespace zo {

void SharedFutexWait(const uint32_t* word, uint32_t expected, absl::Duration timeout) {
  timeout = std::max(timeout, absl::ZeroDuration());
  const timespec relative = absl::ToTimespec(timeout);
  // FUTEX_WAIT without FUTEX_PRIVATE_FLAG: the key is the mapping's page.
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &relative, nullptr, 0);
}

void SharedFutexWakeAll(const uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace zo

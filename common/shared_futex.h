// Waiting on a 32-bit word that several processes map (MAP_SHARED), as the
// same-host route's credits do (worker/client/internal/region_credits.h):
// the kernel's shared futex, keyed by the page rather than the address, so a
// wake in one process reaches a waiter in another. std::atomic::wait uses
// private futexes, which do not.
#ifndef ZO_COMMON_SHARED_FUTEX_H_
#define ZO_COMMON_SHARED_FUTEX_H_

#include <cstdint>

#include "absl/time/time.h"

namespace zo {

// Sleeps while *word == expected, at most `timeout`; returns at once when it
// differs. May return early (a signal, a wake for another value): callers
// look at the word again.
void SharedFutexWait(const uint32_t* word, uint32_t expected, absl::Duration timeout);

// Wakes every thread, of any process, waiting on `word`.
void SharedFutexWakeAll(const uint32_t* word);

}  // namespace zo

#endif  // ZO_COMMON_SHARED_FUTEX_H_

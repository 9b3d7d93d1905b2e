// Calls that wait for something another thread will make true, kept as
// callbacks instead of parked threads: a push waiting for its chunk's
// release, a pull waiting for a version (docs/architecture.md, "Threads").
//
//   under the owner's lock:  if (!ready) ticket = list.Add(key, wake);
//   when it may be ready:    wakes->Post(list.TakeUpTo(key));  // still locked
//   a caller that gives up:  if (list.Remove(ticket)) /* wake never runs */;
//
// Not thread-safe: the owner guards it with the mutex that guards the
// condition, so a waiter cannot miss the change it waits for. The taken
// callbacks run on a WakeQueue, never under that mutex.
#ifndef ZO_SERVER_WAIT_LIST_H_
#define ZO_SERVER_WAIT_LIST_H_

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

namespace zo {

class WaitList {
 public:
  using Ticket = uint64_t;
  static constexpr Ticket kNone = 0;

  // Keeps `wake` until it is taken or removed; `key` orders what TakeUpTo
  // takes (a version, a step).
  Ticket Add(int64_t key, std::function<void()> wake);
  // True when `ticket` was still waiting: its callback will never be taken.
  bool Remove(Ticket ticket);
  // The callbacks of keys <= `key` / of every key, removed from the list.
  std::vector<std::function<void()>> TakeUpTo(int64_t key);
  std::vector<std::function<void()>> TakeAll();

  int size() const { return static_cast<int>(waiting_.size()); }

 private:
  struct Waiter {
    int64_t key;
    std::function<void()> wake;
  };
  Ticket next_ = 1;
  std::map<Ticket, Waiter> waiting_;  // few at a time: one per waiting call
};

}  // namespace zo

#endif  // ZO_SERVER_WAIT_LIST_H_

#include "server/wait_list.h"

#include <utility>

namespace zo {

WaitList::Ticket WaitList::Add(int64_t key, std::function<void()> wake) {
  const Ticket ticket = next_++;
  waiting_.emplace(ticket, Waiter{key, std::move(wake)});
  return ticket;
}

bool WaitList::Remove(Ticket ticket) { return waiting_.erase(ticket) == 1; }

std::vector<std::function<void()>> WaitList::TakeUpTo(int64_t key) {
  std::vector<std::function<void()>> taken;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->second.key <= key) {
      taken.push_back(std::move(it->second.wake));
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

std::vector<std::function<void()>> WaitList::TakeAll() {
  std::vector<std::function<void()>> taken;
  taken.reserve(waiting_.size());
  for (auto& [ticket, waiter] : waiting_) taken.push_back(std::move(waiter.wake));
  waiting_.clear();
  return taken;
}

}  // namespace zo

// The benchmarks that fork a child (wire's server, scale's worker) must fork
// from a process with no threads that could hold a lock the child needs.
// OpenBLAS starts an idle thread pool when it loads (it is linked in through
// the GPU rows' CPU twin); the children never call into it, so those threads
// do not count.
#ifndef ZO_BENCH_INTERNAL_FORK_CHECK_H_
#define ZO_BENCH_INTERNAL_FORK_CHECK_H_

namespace zo::bench_internal {

// Threads of this process besides OpenBLAS's pool (0 when unreadable).
int ThreadsBesidesBlasPool();

}  // namespace zo::bench_internal

#endif  // ZO_BENCH_INTERNAL_FORK_CHECK_H_

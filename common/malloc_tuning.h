// glibc's malloc gives large freed blocks back to the kernel (blocks over the
// mmap threshold are unmapped, the heap top is trimmed, a thread arena's
// extra heaps are unmapped once empty) and faults them in again on the next
// allocation. gRPC allocates and frees a ~1 MiB buffer per bulk message, often
// on another thread, so every gradient piece paid ~256 page faults; on a VM
// that cut push throughput 5-7x (zo-bench wire). Binaries that move bulk
// payloads call this once at start.
#ifndef ZO_COMMON_MALLOC_TUNING_H_
#define ZO_COMMON_MALLOC_TUNING_H_

namespace zo {

// Keeps blocks up to 32 MiB on the heap, trims it only past 1 GiB free, and
// makes every thread allocate from the one main heap. With an arena per
// thread, each gRPC thread that happens to read a socket grows its own
// arena to the bytes in flight and faults all of it in again, and an
// arena's extra heaps are unmapped whenever they empty; with one heap the
// buffers of one message are reused for the next whichever thread reads it
// (zo-bench wire, 7 runs each: ratio median 0.52 -> 0.67). Small blocks
// still come from per-thread caches without a lock; large ones take the
// heap's lock for a moment, which a few thousand messages a second do not
// notice.
void TuneMallocForBulkMessages();

}  // namespace zo

#endif  // ZO_COMMON_MALLOC_TUNING_H_

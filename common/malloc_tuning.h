// glibc's malloc gives large freed blocks back to the kernel (blocks over the
// mmap threshold are unmapped, the heap top is trimmed) and faults them in
// again on the next allocation. gRPC allocates and frees a ~1 MiB buffer per
// bulk message, often on another thread, so every gradient piece paid ~256
// page faults; on a VM that cut push throughput 5-7x (zo-bench wire).
// Binaries that move bulk payloads call this once at start.
#ifndef ZO_COMMON_MALLOC_TUNING_H_
#define ZO_COMMON_MALLOC_TUNING_H_

namespace zo {

// Keeps blocks up to 32 MiB on the heap and trims it only past 1 GiB free.
void TuneMallocForBulkMessages();

}  // namespace zo

#endif  // ZO_COMMON_MALLOC_TUNING_H_

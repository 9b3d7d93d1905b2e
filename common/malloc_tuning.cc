#include "common/malloc_tuning.h"

#include <malloc.h>

namespace zo {

void TuneMallocForBulkMessages() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // Before any thread allocates: a thread keeps the arena it first got.
  mallopt(M_ARENA_MAX, 1);
}

}  // namespace zo

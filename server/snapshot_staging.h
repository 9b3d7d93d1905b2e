// The buffers a checkpoint snapshot's step hook copies tiles into for the
// background writer (server/state_snapshot.h), kept from one checkpoint to
// the next: fresh memory would cost the step a page fault per 4 KiB, which on
// a VM is more than the copy. At most `limit_bytes` are out at once; the pool
// keeps what it handed out at its peak, never more.
//
//   SnapshotStaging staging(1 << 30, 3 * kTileElems);
//   AlignedBuffer b = staging.Take();   // no data() past the limit
//   ... copy, write ...
//   staging.Give(std::move(b));
//
// Thread-safe.
#ifndef ZO_SERVER_SNAPSHOT_STAGING_H_
#define ZO_SERVER_SNAPSHOT_STAGING_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "offload/aligned_buffer.h"

namespace zo {

class SnapshotStaging {
 public:
  SnapshotStaging(int64_t limit_bytes, int64_t buffer_floats);

  int64_t buffer_floats() const { return buffer_floats_; }
  // A page-aligned buffer of buffer_floats() floats (so the writer can send
  // it to the disk directly), or an empty one when limit_bytes are out.
  AlignedBuffer Take();
  void Give(AlignedBuffer buffer);
  // Bytes held, out or free: the pool's RAM.
  int64_t held_bytes() const;

 private:
  const int64_t buffer_floats_;
  const int64_t max_buffers_;
  mutable std::mutex mu_;
  std::vector<AlignedBuffer> free_;
  int64_t allocated_ = 0;
};

}  // namespace zo

#endif  // ZO_SERVER_SNAPSHOT_STAGING_H_

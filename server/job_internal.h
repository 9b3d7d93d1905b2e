// Helpers shared by the files that implement Job (job.cc, job_step.cc,
// job_pull.cc, job_checkpoint.cc).
#ifndef ZO_SERVER_JOB_INTERNAL_H_
#define ZO_SERVER_JOB_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/convert.h"
#include "common/dtype.h"

namespace zo::job_internal {

// Bytes of optimizer state per element: fp32 master, m and v.
inline constexpr int64_t kStateBytesPerElem = 12;

// fp32 master -> the job's dtype: the low-precision copy pulls are served.
inline void RoundMaster(const float* src, void* dst, size_t n, DType dtype) {
  FloatToDType(src, dtype, dst, n);
}

// A random, nonzero id for a new instance of a job (JobStatus.incarnation).
uint64_t NewIncarnation();

}  // namespace zo::job_internal

#endif  // ZO_SERVER_JOB_INTERNAL_H_

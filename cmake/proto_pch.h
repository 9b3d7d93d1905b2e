// The headers that the files of the libraries above the wire protocol
// (zo_rpc, zo_server, zo_client, zo_train, zo_bench_lib: PROTO_PCH in their
// CMakeLists) mostly include, precompiled once per library
// (cmake/ZoHelpers.cmake): the generated messages, protobuf and Abseil were
// a third to half of such a file's compile time. gRPC itself is left out:
// few of these files include it, and a bigger header costs every file more
// to load. A file must still include what it uses; the pip build has no
// precompiled headers and checks that.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/zo/v1/error.pb.h"
#include "proto/zo/v1/offload_service.pb.h"

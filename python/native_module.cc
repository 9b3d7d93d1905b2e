// zo._native: the offload client and the embedded server for Python.
//
// Tensors cross as Python buffers (a torch tensor's .numpy() view, bf16
// viewed as int16): the client reads gradients from and writes weights into
// that memory directly; Python never copies a gradient byte. Every call that
// waits on the servers releases the GIL, so other Python threads (a data
// loader) go on.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <xxhash.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/convert.h"
#include "common/dtype.h"
#include "common/sharding.h"
#include "common/status_context.h"
#include "common/status_macros.h"
#include "python/parallel_elements.h"
#include "python/widen_tensors.h"
#include "rpc/in_process_route.h"
#include "rpc/job_move.h"
#include "server/offload_server.h"
#include "worker/client/follow_job.h"
#include "worker/client/offload_client.h"

namespace py = pybind11;

namespace zo::python {
namespace {

// A failed Status becomes a RuntimeError carrying its message (which names
// the server, the tensor or the step).
void Check(const absl::Status& status) {
  if (!status.ok()) throw std::runtime_error(std::string(status.ToString()));
}
template <typename T>
T Check(absl::StatusOr<T> value) {
  Check(value.status());
  return *std::move(value);
}

// The bytes of a C-contiguous buffer; `what` names it in errors.
absl::Span<std::byte> Bytes(const py::buffer& buffer, bool writable, const std::string& what) {
  py::buffer_info info = buffer.request(writable);
  py::ssize_t expect = info.itemsize;
  for (int d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expect) {
      throw py::value_error(what + " is not contiguous: call .contiguous() first");
    }
    expect *= info.shape[d];
  }
  return {static_cast<std::byte*>(info.ptr), static_cast<size_t>(info.size * info.itemsize)};
}

// Python objects whose memory the client is still sending from. The client
// (or, in-process, the embedded server reading the same bytes) lets go of
// its last reference on one of gRPC's threads, where taking the GIL could
// deadlock against a Python thread waiting in a push; so while the client
// is open the reference goes into this queue and is dropped by the next
// call that holds the GIL anyway (a push, finish_step, close). After close
// nothing waits on gRPC's threads, and they drop it themselves.
class ReleaseQueue {
 public:
  void Add(PyObject* object) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!closed_) {
        pending_.push_back(object);
        return;
      }
    }
    if (!Py_IsInitialized()) return;  // the interpreter is gone: nothing to free
    py::gil_scoped_acquire gil;
    Py_DECREF(object);
  }
  // Requires the GIL.
  void Drain() {
    std::vector<PyObject*> pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending.swap(pending_);
    }
    for (PyObject* object : pending) Py_DECREF(object);
  }
  // Requires the GIL: drains, and later references are dropped where they fall.
  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    Drain();
  }

 private:
  std::mutex mu_;
  bool closed_ = false;
  std::vector<PyObject*> pending_;
};

// An OffloadServer in this process, reached without a socket.
class EmbeddedServer {
 public:
  EmbeddedServer(const std::string& checkpoint_dir, int threads) {
    ServerOptions options;
    options.listen = "";
    options.checkpoint_dir = checkpoint_dir;
    options.threads = threads;
    server_ = Check(OffloadServer::Start(options));
  }
  ~EmbeddedServer() { Shutdown(); }
  void Shutdown() {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(1));
  }
  std::shared_ptr<grpc::Channel> Channel() { return server_->InProcessChannel(); }
  std::shared_ptr<InProcessRoute> Route() { return server_->DataRoute(); }

 private:
  std::unique_ptr<OffloadServer> server_;
};

// (name, shape, dtype name) per tensor, in the job's order.
using ManifestEntry = std::tuple<std::string, std::vector<int64_t>, std::string>;

// A place in a same-host route's shared region (Client.region_pull_places,
// region_push_places): its bytes as a writable Python buffer, which keeps
// the region mapped while it lives, even after its client closed.
struct RegionPlace {
  absl::Span<std::byte> bytes;
  std::shared_ptr<const void> keeper;
};

class Client {
 public:
  Client(const std::string& config_json, const std::vector<ManifestEntry>& manifest,
         const std::vector<std::string>& servers, EmbeddedServer* embedded, const std::string& job,
         int dp_rank, int dp_world_size, const std::string& auth_token,
         const std::vector<int>& groups, uint64_t init_fingerprint) {
    if (!groups.empty() && groups.size() != manifest.size()) {
      throw py::value_error(absl::StrCat(groups.size(), " parameter groups for ", manifest.size(),
                                         " tensors: give one per tensor, or none"));
    }
    std::vector<TensorSpec> specs;
    for (const auto& [name, shape, dtype_name] : manifest) {
      const std::optional<DType> dtype = ParseDType(dtype_name);
      if (!dtype) {
        throw py::value_error(absl::StrCat("tensor '", name, "': dtype '", dtype_name,
                                           "' is not fp32, fp16 or bf16"));
      }
      const int group = groups.empty() ? 0 : groups[specs.size()];
      specs.push_back({.name = name, .shape = shape, .dtype = *dtype, .group = group});
    }
    ClientOptions options;
    options.job = job;
    options.servers = servers;
    if (embedded != nullptr) {
      if (!servers.empty()) throw py::value_error("give servers or an embedded server, not both");
      options.channels = {embedded->Channel()};
      options.routes = {embedded->Route()};
    } else if (servers.empty()) {
      throw py::value_error("no servers and no embedded server");
    }
    options.dp_rank = dp_rank;
    options.dp_world_size = dp_world_size;
    options.auth_token = auth_token;
    options.init_fingerprint = init_fingerprint;
    // zo.torch forms a delayed step's weights itself (_torch_compensation.py).
    options.applies_dpu_compensation = true;
    options_ = options;
    config_json_ = config_json;
    specs_ = specs;
    py::gil_scoped_release release;
    Check(OpenClients());
  }

  // Whether the last failed call was answered "the job moved" (zo-ctl
  // rescale): then follow() attaches where it went.
  bool moved() const { return move_.has_value(); }

  // Attaches to the servers the job moved to, once it is there at the
  // version the move named (they may still be restoring it), for at most 5
  // minutes; returns the version it is at.
  int64_t Follow() {
    if (!move_.has_value()) throw py::value_error("follow(): the job has not moved");
    const JobMove move = *move_;
    py::gil_scoped_release release;
    resend_client_.reset();
    client_.reset();
    options_.servers = move.servers;
    options_.channels.clear();
    options_.routes.clear();
    options_.attach_only = true;
    // FollowJob tries again itself, at its own pace.
    options_.open_retry_for = absl::Seconds(1);
    const absl::Status followed = FollowJob(move, [&] {
      ZO_RETURN_IF_ERROR(OpenClients());
      return CheckArrived(*client_, move);
    });
    if (!followed.ok()) {
      // Closed, as the comment on open() says; a move to yet other servers
      // is followed by the next follow().
      resend_client_.reset();
      client_.reset();
      move_ = ParseJobMove(followed);
      Check(WithContext(followed, absl::StrCat("following job ", move.job, " to ",
                                               absl::StrJoin(move.servers, ","))));
    }
    move_.reset();
    return client_->version();
  }

  int64_t version() const { return open().version(); }
  double loss_scale() const { return open().loss_scale(); }

  void InitParams(int tensor, const py::buffer& values) {
    const absl::Span<std::byte> bytes = Bytes(values, false, "initial values");
    if (values.request().itemsize != 4) throw py::value_error("initial values must be float32");
    py::gil_scoped_release release;
    Check(open().InitParams(
        tensor, {reinterpret_cast<const float*>(bytes.data()), bytes.size() / sizeof(float)}));
  }

  // Queues the gradient, sent from the buffer's own memory: the client
  // keeps a reference to `gradient` until its last byte is written, so the
  // caller must not change it before finish_step returns.
  void Push(int64_t step, int tensor, const py::buffer& gradient) {
    const absl::Span<std::byte> bytes = Bytes(gradient, false, "gradient");
    released_->Drain();
    PyObject* object = gradient.ptr();
    Py_INCREF(object);
    std::shared_ptr<const void> owner(
        bytes.data(), [queue = released_, object](const void*) { queue->Add(object); });
    absl::Status pushed;
    {
      py::gil_scoped_release release;
      pushed = active().PushShared(step, tensor, std::move(owner), bytes);
    }
    CheckNoting(pushed);
  }

  // Queues a float32 gradient for a job of another dtype, rounded to it
  // (to nearest even, as torch's .to()) by this call, with the GIL
  // released, straight into the place its server reads it where the route
  // lends one (the embedded server's accumulator, the same-host region;
  // OffloadClient::PushBuffers), else into a buffer kept for the tensor:
  // one pass over the values and no staging tensor. The values are not
  // read once this returns.
  void PushConverted(int64_t step, int tensor, const py::buffer& values) {
    CheckTensorIndex(tensor);
    const py::buffer_info info = values.request();
    if (info.itemsize != 4 || info.format != py::format_descriptor<float>::format()) {
      throw py::value_error("push_converted takes float32 values");
    }
    const absl::Span<std::byte> bytes = Bytes(values, false, "gradient");
    released_->Drain();
    absl::Status pushed;
    {
      py::gil_scoped_release release;
      pushed = PushConvertedReleased(step, tensor, bytes);
    }
    CheckNoting(pushed);
  }

  // Queues step `step`'s gradients of `tensors` in one call: gradients[i]
  // is tensor tensors[i]'s gradient as a contiguous CPU torch tensor (read
  // through data_ptr(), numel(), element_size(), is_contiguous() and
  // is_cpu, so no torch headers here). Without `convert` its elements are
  // in the job's dtype and are sent from its memory, as push does (a
  // reference is kept until they are written); with `convert` they are
  // float32 values rounded as push_converted does. With `lend` (and not
  // `convert`), an embedded server may read them in place until it has
  // updated the step (OffloadClient::PushLent). Every gradient is checked
  // before any is pushed, and the GIL is released once for all.
  void PushTensors(int64_t step, const std::vector<int>& tensors, const py::list& gradients,
                   bool convert, bool lend) {
    if (tensors.size() != gradients.size()) {
      throw py::value_error(absl::StrCat("push_tensors: ", tensors.size(), " tensor indices for ",
                                         gradients.size(), " gradients"));
    }
    std::vector<Gradient> checked;
    checked.reserve(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const int tensor = tensors[i];
      CheckTensorIndex(tensor);
      const TensorSpec& spec = specs_[static_cast<size_t>(tensor)];
      const py::handle g = gradients[i];
      const std::string what =
          absl::StrCat("the gradient of tensor ", tensor, " ('", spec.name, "')");
      if (!py::hasattr(g, "data_ptr")) {
        throw py::type_error(absl::StrCat(
            what, " is a ", py::str(g.get_type().attr("__module__")).cast<std::string>(), ".",
            py::str(g.get_type().attr("__name__")).cast<std::string>(), ", not a torch tensor"));
      }
      if (!g.attr("is_cpu").cast<bool>() || !g.attr("is_contiguous")().cast<bool>()) {
        throw py::value_error(what + " is not a contiguous CPU tensor");
      }
      const auto elems = g.attr("numel")().cast<int64_t>();
      if (elems != NumElements(spec.shape)) {
        throw py::value_error(
            absl::StrCat(what, " has ", elems, " elements; it has ", NumElements(spec.shape)));
      }
      const auto elem_bytes = g.attr("element_size")().cast<int64_t>();
      if (convert ? (elem_bytes != 4 || spec.dtype == DType::kFloat32)
                  : elem_bytes != static_cast<int64_t>(DTypeSize(spec.dtype))) {
        throw py::value_error(
            absl::StrCat(what, " has ", elem_bytes, "-byte elements: push_tensors takes ",
                         convert ? "float32 values (convert=True) for a 16-bit job"
                                 : absl::StrCat(std::string(DTypeName(spec.dtype)), " elements")));
      }
      if (elems == 0) continue;  // nothing to send
      checked.push_back(
          {.tensor = tensor,
           .data = reinterpret_cast<const std::byte*>(g.attr("data_ptr")().cast<uintptr_t>()),
           .object = g});
    }
    released_->Drain();
    absl::Status pushed;
    if (convert) {
      py::gil_scoped_release release;
      pushed = RoundAndPushAll(step, checked);
    } else {
      // Each push keeps its tensor alive until its bytes are written.
      std::vector<std::shared_ptr<const void>> owners;
      owners.reserve(checked.size());
      for (const Gradient& g : checked) {
        PyObject* object = g.object.inc_ref().ptr();
        owners.emplace_back(g.data,
                            [queue = released_, object](const void*) { queue->Add(object); });
      }
      py::gil_scoped_release release;
      for (size_t i = 0; i < checked.size() && pushed.ok(); ++i) {
        const TensorSpec& spec = specs_[static_cast<size_t>(checked[i].tensor)];
        const absl::Span<const std::byte> bytes(
            checked[i].data, static_cast<size_t>(NumElements(spec.shape)) * DTypeSize(spec.dtype));
        pushed = lend ? active().PushLent(step, checked[i].tensor, std::move(owners[i]), bytes)
                      : active().PushShared(step, checked[i].tensor, std::move(owners[i]), bytes);
      }
      owners.clear();  // those not pushed (an error): released_ drops them
    }
    CheckNoting(pushed);
  }

  // The same-host route's places of `tensors`' pulled weights: a
  // RegionPlace each (None for a tensor with no elements), or [] where
  // some tensor has none (OffloadClient::RegionPullBuffers). From now on
  // a pull into these places copies nothing, and a pull into other
  // buffers takes gRPC for their servers. They are the lasting client's:
  // the resend client that a restarted worker's first step goes through
  // has a region of its own, gone after that step (its pulls copy).
  py::list RegionPullPlaces(const std::vector<int>& tensors) {
    for (const int t : tensors) CheckTensorIndex(t);
    std::shared_ptr<const void> keeper;
    return PlacesOf(open().RegionPullBuffers(tensors, &keeper), keeper);
  }

  // The same-host route's places of `tensors`' gradients for `step` (in the
  // step's gradient area of the shared region), as region_pull_places gives
  // the weights': lent until finish_step(step), so that a push of a tensor
  // from its place copies nothing, and one from other bytes takes gRPC. []
  // where some tensor has none (OffloadClient::PushBuffers with a keeper).
  py::list RegionPushPlaces(int64_t step, const std::vector<int>& tensors) {
    for (const int t : tensors) CheckTensorIndex(t);
    std::shared_ptr<const void> keeper;
    absl::StatusOr<std::vector<absl::Span<std::byte>>> places;
    {
      py::gil_scoped_release release;
      places = active().PushBuffers(step, tensors, &keeper);
    }
    CheckNoting(places.status());
    return PlacesOf(*places, keeper);
  }

  // The step's learning rate of every parameter group (zo.client_lr), and
  // where given, every group's (beta1, beta2, eps, weight_decay).
  void SetStepLr(int64_t step, const std::vector<double>& group_lr,
                 const std::vector<std::array<double, 4>>& group_hyper) {
    std::vector<ParamGroupConfig> hyper;
    hyper.reserve(group_hyper.size());
    for (const auto& [beta1, beta2, eps, weight_decay] : group_hyper) {
      hyper.push_back({.betas = {beta1, beta2}, .eps = eps, .weight_decay = weight_decay});
    }
    absl::Status sent;
    {
      py::gil_scoped_release release;
      sent = active().SetStepLr(step, group_lr, hyper);
    }
    CheckNoting(sent);
  }

  void FinishStep(int64_t step) {
    absl::Status finished;
    {
      py::gil_scoped_release release;
      finished = active().FinishStep(step);
      // The step after a restart is done: later ones are sent only once.
      if (finished.ok()) resend_client_.reset();
    }
    released_->Drain();  // every byte of the step is written
    CheckNoting(finished);
  }

  // (whether dst changed, the loss scale of the step's weights).
  // The version the last pull_for_step brought or found unchanged; -1
  // before the first and after a failed one.
  int64_t LastPulledVersion() const { return active().last_pulled_version(); }

  // zo.dpu.compensation "worker": per manifest tensor, the coefficients
  // (last, before, grad) of the weights a delayed step computes on, from
  // step `step`'s decision (common/dpu_compensation.h).
  std::vector<std::tuple<double, double, double>> StepCompensation(int64_t step, bool have_before) {
    absl::StatusOr<std::vector<WeightsCompensation>> terms;
    {
      py::gil_scoped_release release;
      terms = active().StepCompensation(step, have_before);
    }
    CheckNoting(terms.status());
    std::vector<std::tuple<double, double, double>> out;
    for (const WeightsCompensation& w : *terms) out.emplace_back(w.last, w.before, w.grad);
    return out;
  }

  std::pair<bool, double> PullForStep(int64_t step, const std::vector<int>& tensors,
                                      const std::vector<py::buffer>& dst) {
    std::vector<absl::Span<std::byte>> spans;
    for (const py::buffer& b : dst) spans.push_back(Bytes(b, true, "weights"));
    absl::StatusOr<bool> changed;
    double scale = 1;
    {
      py::gil_scoped_release release;
      changed = active().PullForStep(step, tensors, spans, &scale);
    }
    CheckNoting(changed.status());
    return {*changed, scale};
  }

  py::dict JobStatus() {
    v1::JobStatus s;
    {
      py::gil_scoped_release release;
      s = Check(open().JobStatus());
    }
    py::dict d;
    d["version"] = s.version();
    d["loss_scale"] = s.loss_scale();
    d["applied_steps"] = s.applied_steps();
    d["last_skipped"] = s.last_skipped();
    d["last_grad_norm"] = s.last_grad_norm();
    d["last_lr"] = s.last_lr();
    d["init_fingerprint"] = s.init_fingerprint();
    return d;
  }

  // The lasting client's gradient and weight bytes so far
  // (OffloadClient::Traffic): what a push took from where its server reads.
  py::dict Traffic() const {
    const OffloadClient::Traffic t = open().traffic();
    py::dict d;
    d["pushed_bytes"] = t.pushed_bytes;
    d["pulled_bytes"] = t.pulled_bytes;
    d["pushed_in_place_bytes"] = t.pushed_in_place_bytes;
    return d;
  }

  std::string Checkpoint(int64_t min_version) {
    py::gil_scoped_release release;
    return Check(open().Checkpoint(min_version));
  }

  int64_t Restore(const std::string& path) {
    py::gil_scoped_release release;
    resend_client_.reset();  // a restore drops every partly pushed step
    return Check(open().Restore(path));
  }

  void Close() {
    {
      py::gil_scoped_release release;
      resend_client_.reset();
      client_.reset();
    }
    released_->Close();
  }

  ~Client() {
    if (client_ != nullptr) Close();
  }

 private:
  // Opens the client (and, for a job that has trained, the resend client).
  absl::Status OpenClients() {
    ZO_ASSIGN_OR_RETURN(client_, OffloadClient::Open(options_, config_json_, specs_));
    if (client_->version() > 0) {
      // A job that has trained: this process may be a restarted worker
      // whose last run pushed part of the next step before it died. Its
      // first step goes through a client that skips what the servers
      // already have from this rank instead of rejecting it.
      ClientOptions resend = options_;
      resend.resend = true;
      ZO_ASSIGN_OR_RETURN(resend_client_, OffloadClient::Open(resend, config_json_, specs_));
    }
    return absl::OkStatus();
  }

  absl::Status PushConvertedReleased(int64_t step, int tensor, absl::Span<const std::byte> bytes) {
    const TensorSpec& spec = specs_[static_cast<size_t>(tensor)];
    const size_t n = bytes.size() / sizeof(float);
    if (static_cast<int64_t>(n) != NumElements(spec.shape)) {
      return absl::InvalidArgumentError(absl::StrCat("the gradient of tensor ", tensor, " ('",
                                                     spec.name, "') has ", n, " elements; it has ",
                                                     NumElements(spec.shape)));
    }
    return RoundAndPushAll(step, {{.tensor = tensor, .data = bytes.data(), .object = {}}});
  }

  // A gradient push_tensors checked: its tensor, its first byte, the
  // Python tensor that owns them.
  struct Gradient {
    int tensor;
    const std::byte* data;
    py::handle object;
  };

  // Rounds each of `gradients` (float32 values, its tensor's element
  // count) to its tensor's dtype, into the places one PushBuffers call
  // lends for them all or, with none, into buffers kept per tensor, and
  // pushes it from there. The rounding runs on every core, a batch of about
  // kRoundBatchElems at a time, and a batch is pushed once it is rounded,
  // so the server's work on it overlaps the rounding of the next.
  absl::Status RoundAndPushAll(int64_t step, const std::vector<Gradient>& gradients) {
    std::vector<int> tensors;
    tensors.reserve(gradients.size());
    for (const Gradient& g : gradients) tensors.push_back(g.tensor);
    ZO_ASSIGN_OR_RETURN(const std::vector<absl::Span<std::byte>> lent,
                        active().PushBuffers(step, tensors));
    struct Rounding {
      int tensor;
      const float* src;
      DType dtype;
      absl::Span<std::byte> dst = {};
      std::shared_ptr<const void> owner = nullptr;
    };
    std::vector<Rounding> batch;
    std::vector<int64_t> batch_elems;
    auto round_and_push = [&]() -> absl::Status {
      ForElementsInParallel(batch_elems, [&](size_t i, int64_t begin, int64_t end) {
        const Rounding& r = batch[i];
        FloatToDType(r.src + begin, r.dtype, r.dst.data() + begin * DTypeSize(r.dtype),
                     static_cast<size_t>(end - begin));
      });
      for (Rounding& r : batch) {
        ZO_RETURN_IF_ERROR(active().PushShared(step, r.tensor, std::move(r.owner), r.dst));
      }
      batch.clear();
      batch_elems.clear();
      return absl::OkStatus();
    };
    int64_t elems_in_batch = 0;
    for (size_t i = 0; i < gradients.size(); ++i) {
      const int tensor = gradients[i].tensor;
      const TensorSpec& spec = specs_[static_cast<size_t>(tensor)];
      const int64_t n = NumElements(spec.shape);
      Rounding r{.tensor = tensor,
                 .src = reinterpret_cast<const float*>(gradients[i].data),
                 .dtype = spec.dtype};
      if (!lent.empty()) {
        r.dst = lent[i];
        r.owner = std::shared_ptr<const void>(r.dst.data(), [](const void*) {});  // the server's
      } else {
        std::shared_ptr<std::vector<std::byte>> buffer = ConvertedBuffer(tensor, n, spec.dtype);
        r.dst = absl::MakeSpan(*buffer);
        r.owner = std::move(buffer);
      }
      batch.push_back(std::move(r));
      batch_elems.push_back(n);
      elems_in_batch += n;
      if (elems_in_batch >= kRoundBatchElems || i + 1 == gradients.size()) {
        ZO_RETURN_IF_ERROR(round_and_push());
        elems_in_batch = 0;
      }
    }
    return absl::OkStatus();
  }

  // Rounded gradients in a batch (RoundAndPushAll): 8 MiB of 16-bit values.
  static constexpr int64_t kRoundBatchElems = int64_t{4} << 20;

  // The buffer kept for tensor `tensor`'s rounded gradient (n elements of
  // dtype) where no place is lent: kept from step to step, a fresh one
  // while a push still sends the last step's (a delayed update's chunk not
  // yet free).
  std::shared_ptr<std::vector<std::byte>> ConvertedBuffer(int tensor, int64_t n, DType dtype) {
    std::lock_guard lock(converted_mu_);
    std::shared_ptr<std::vector<std::byte>>& kept = converted_[tensor];
    if (kept == nullptr || kept.use_count() > 1) {
      kept = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(n) * DTypeSize(dtype));
    }
    return kept;
  }

  // A region's places as Python: a RegionPlace holding `keeper` each, None
  // for an empty one (a tensor with no elements).
  static py::list PlacesOf(const std::vector<absl::Span<std::byte>>& places,
                           const std::shared_ptr<const void>& keeper) {
    py::list out;
    for (const absl::Span<std::byte> place : places) {
      if (place.empty()) {
        out.append(py::none());
      } else {
        out.append(py::cast(RegionPlace{place, keeper}));
      }
    }
    return out;
  }

  // IndexError for an index outside the manifest.
  void CheckTensorIndex(int tensor) const {
    if (tensor < 0 || tensor >= static_cast<int>(specs_.size())) {
      throw py::index_error(absl::StrCat("tensor index ", tensor, " is outside the ", specs_.size(),
                                         "-tensor manifest"));
    }
  }

  // Check, remembering a "the job moved" answer for follow().
  void CheckNoting(const absl::Status& status) {
    if (!status.ok()) move_ = ParseJobMove(status);
    Check(status);
  }

  // The client, or a RuntimeError when it is closed (or a follow() failed):
  // never a null dereference from Python.
  OffloadClient& open() const {
    if (client_ == nullptr) {
      throw std::runtime_error("FAILED_PRECONDITION: this zo client is closed");
    }
    return *client_;
  }
  OffloadClient& active() const { return resend_client_ != nullptr ? *resend_client_ : open(); }

  std::unique_ptr<OffloadClient> client_;
  std::unique_ptr<OffloadClient> resend_client_;  // until the first step after a restart
  ClientOptions options_;
  std::string config_json_;
  std::vector<TensorSpec> specs_;
  std::optional<JobMove> move_;  // what the last failed call said, if the job moved
  std::shared_ptr<ReleaseQueue> released_ = std::make_shared<ReleaseQueue>();
  // push_converted's buffers, per tensor, where no place is lent.
  std::mutex converted_mu_;
  absl::flat_hash_map<int, std::shared_ptr<std::vector<std::byte>>> converted_
      ABSL_GUARDED_BY(converted_mu_);
};

// XXH3 (64 bits) of a buffer's bytes: zo.torch's fingerprint of a model's
// initial weights, at memory speed.
uint64_t Xxh3(const py::buffer& data) {
  const absl::Span<std::byte> bytes = Bytes(data, false, "data");
  py::gil_scoped_release release;
  return XXH3_64bits(bytes.data(), bytes.size());
}

// The config's warnings (unknown or renamed keys, overridden settings), for
// Python's warnings module; a config ParseConfig refuses gives none here
// (the Client's open names its error).
std::vector<std::string> ConfigWarnings(const std::string& config_json, int dp_world_size) {
  absl::StatusOr<LoadedConfig> loaded =
      ParseConfig(config_json, {.dp_world_size = dp_world_size, .log_diagnostics = false});
  return loaded.ok() ? loaded->warnings : std::vector<std::string>{};
}

}  // namespace
}  // namespace zo::python

PYBIND11_MODULE(_native, m) {
  using zo::python::Client;
  using zo::python::EmbeddedServer;
  using zo::python::ManifestEntry;
  using zo::python::RegionPlace;
  m.doc() = "zo's offload client and embedded server (use zo.torch)";
  m.def("config_warnings", &zo::python::ConfigWarnings, py::arg("config_json"),
        py::arg("dp_world_size") = 1);
  m.def("xxh3_64", &zo::python::Xxh3, py::arg("data"));
  m.def("widen", &zo::python::Widen, py::arg("sources"), py::arg("destinations"));
  py::class_<EmbeddedServer>(m, "EmbeddedServer")
      .def(py::init<const std::string&, int>(), py::arg("checkpoint_dir") = "",
           py::arg("threads") = 0)
      .def("shutdown", &EmbeddedServer::Shutdown, py::call_guard<py::gil_scoped_release>());
  py::class_<RegionPlace>(m, "RegionPlace", py::buffer_protocol())
      .def_buffer([](RegionPlace& p) {
        return py::buffer_info(p.bytes.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(p.bytes.size())}, {1});
      })
      .def("__len__", [](const RegionPlace& p) { return p.bytes.size(); });
  py::class_<Client>(m, "Client")
      .def(py::init<const std::string&, const std::vector<ManifestEntry>&,
                    const std::vector<std::string>&, EmbeddedServer*, const std::string&, int, int,
                    const std::string&, const std::vector<int>&, uint64_t>(),
           py::arg("config_json"), py::arg("manifest"),
           py::arg("servers") = std::vector<std::string>(), py::arg("embedded") = nullptr,
           py::arg("job") = "zo-torch", py::arg("dp_rank") = 0, py::arg("dp_world_size") = 1,
           py::arg("auth_token") = "", py::arg("groups") = std::vector<int>(),
           py::arg("init_fingerprint") = 0,
           py::keep_alive<1, 5>())  // the embedded server outlives the client
      .def_property_readonly("version", &Client::version)
      .def_property_readonly("loss_scale", &Client::loss_scale)
      .def("init_params", &Client::InitParams)
      .def("push", &Client::Push)
      .def("push_tensors", &Client::PushTensors, py::arg("step"), py::arg("tensors"),
           py::arg("gradients"), py::arg("convert") = false, py::arg("lend") = false)
      .def("push_converted", &Client::PushConverted, py::arg("step"), py::arg("tensor"),
           py::arg("values"))
      .def("set_step_lr", &Client::SetStepLr, py::arg("step"), py::arg("group_lr"),
           py::arg("group_hyper") = std::vector<std::array<double, 4>>())
      .def("region_pull_places", &Client::RegionPullPlaces, py::arg("tensors"))
      .def("region_push_places", &Client::RegionPushPlaces, py::arg("step"), py::arg("tensors"))
      .def("finish_step", &Client::FinishStep)
      .def("pull_for_step", &Client::PullForStep)
      .def_property_readonly("last_pulled_version", &Client::LastPulledVersion)
      .def("step_compensation", &Client::StepCompensation, py::arg("step"), py::arg("have_before"))
      .def("job_status", &Client::JobStatus)
      .def("traffic", &Client::Traffic)
      .def("checkpoint", &Client::Checkpoint, py::arg("min_version") = 0)
      .def("restore", &Client::Restore, py::arg("path") = "")
      .def("moved", &Client::moved)
      .def("follow", &Client::Follow)
      .def("close", &Client::Close);
}

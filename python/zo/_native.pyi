"""zo's offload client and embedded server (use zo.torch).

Type stubs for the pybind11 extension built from python/native_module.cc;
keep them in step with its PYBIND11_MODULE block. Every call that fails
raises RuntimeError carrying the absl::Status text (its code first, e.g.
"UNAVAILABLE: ..."); a malformed argument raises ValueError. Calls that wait
on the servers release the GIL.
"""

from typing import Any, Sequence, TypedDict

from typing_extensions import Buffer

def config_warnings(config_json: str, dp_world_size: int = 1) -> list[str]:
    """The DeepSpeed-style config's warnings (unknown or renamed keys,
    overridden settings); empty for a config the client's open would refuse."""

def xxh3_64(data: Buffer) -> int:
    """XXH3 (64 bits) of a contiguous buffer's bytes."""

def widen(sources: list[Any], destinations: list[Any]) -> None:
    """Widens each contiguous CPU bfloat16 or float16 tensor of sources into
    the float32 tensor of as many elements at the same index of
    destinations, exactly, on every core with the GIL released."""

class EmbeddedServer:
    """An OffloadServer in this process, reached without a socket."""

    def __init__(self, checkpoint_dir: str = "", threads: int = 0) -> None:
        """threads 0: one per core. checkpoint_dir "": checkpoints refused."""
    def shutdown(self) -> None:
        """Stops the server (waits up to a second for calls in flight)."""

class RegionPlace:
    """A place in a same-host route's shared region (Client.region_pull_places,
    Client.region_push_places): its bytes as a writable buffer
    (torch.frombuffer), which keeps the region mapped while it lives, even
    after its client closed."""

    def __len__(self) -> int: ...

class _JobStatus(TypedDict):
    """What Client.job_status() returns (a plain dict; for type checkers only)."""

    version: int
    loss_scale: float
    applied_steps: int
    last_skipped: bool
    last_grad_norm: float
    last_lr: float
    init_fingerprint: int

class _Traffic(TypedDict):
    """What Client.traffic() returns (a plain dict; for type checkers only)."""

    pushed_bytes: int
    pulled_bytes: int
    pushed_in_place_bytes: int

class Client:
    """One worker's connection to a job on zo's servers: opens (or attaches
    to) the job, pushes gradients and pulls weights by step."""

    def __init__(
        self,
        config_json: str,
        manifest: Sequence[tuple[str, Sequence[int], str]],
        servers: Sequence[str] = ...,
        embedded: EmbeddedServer | None = None,
        job: str = "zo-torch",
        dp_rank: int = 0,
        dp_world_size: int = 1,
        auth_token: str = "",
        groups: Sequence[int] = ...,
        init_fingerprint: int = 0,
    ) -> None:
        """manifest: (name, shape, dtype) per tensor in the job's order, dtype
        "fp32", "fp16" or "bf16". Give servers ("host:port") or an embedded
        server, not both; the embedded server is kept alive by the client.
        groups: each tensor's index into the config's zo.param_groups (none:
        every tensor in group 0). init_fingerprint: a hash of the manifest and
        initial weights (0: none); opening a job at version 0 that another
        started from other weights is refused."""
    @property
    def version(self) -> int:
        """The job's version: the number of finished steps."""
    @property
    def loss_scale(self) -> float:
        """The fp16 loss scale of the job (1 without fp16)."""
    def init_params(self, tensor: int, values: Buffer, /) -> None:
        """Sets a tensor's starting weights (a float32 buffer) on a new job."""
    def push(self, step: int, tensor: int, gradient: Buffer, /) -> None:
        """Queues a tensor's gradient for a step, sent from the buffer's own
        memory: leave it unchanged until finish_step(step) returns."""
    def push_converted(self, step: int, tensor: int, values: Buffer) -> None:
        """Queues a float32 gradient for a job of another dtype, rounded to
        it (to nearest even, as torch's .to()) straight into where the
        tensor's server reads it when the route lends that place; the
        values are not read once this returns."""
    def push_tensors(
        self,
        step: int,
        tensors: Sequence[int],
        gradients: list[Any],
        convert: bool = False,
        lend: bool = False,
    ) -> None:
        """Queues the gradients of several tensors in one call: each a
        contiguous CPU torch tensor, in the job's dtype (sent from its own
        memory, as push: leave it unchanged until finish_step) or, with
        convert, float32 values rounded as push_converted does. With lend,
        an embedded server may read the job-dtype ones in place instead of
        copying them: leave them unchanged until the step's weights are
        pulled (without a delayed update; with one, lend is ignored). Every
        gradient is checked before any is pushed."""
    def set_step_lr(self, step: int, group_lr: Sequence[float],
                    group_hyper: Sequence[tuple[float, float, float, float]] = ...) -> None:
        """With zo.client_lr: every parameter group's learning rate for the
        step, sent to the lead before the step's first push; with
        group_hyper, every group's (beta1, beta2, eps, weight_decay) for it
        too (else the job's own; Adam and AdamW)."""
    def region_pull_places(self, tensors: Sequence[int]) -> list[RegionPlace | None]:
        """On the same-host route: where the server writes each tensor's
        pulled weights (None for a tensor with no elements), or [] where some
        tensor has no such place. From then on a pull into these places
        copies nothing, and a pull into other buffers takes gRPC."""
    def region_push_places(self, step: int, tensors: Sequence[int]) -> list[RegionPlace | None]:
        """On the same-host route: where the server reads each tensor's
        gradient of the step (None for a tensor with no elements), or []
        where some tensor has no such place. Lent until finish_step(step): a
        push from these places copies nothing, one from other bytes takes
        gRPC. RuntimeError while the places of step - 2 are still lent."""
    def finish_step(self, step: int, /) -> None:
        """Waits until every gradient of the step is acknowledged."""
    def pull_for_step(
        self, step: int, tensors: Sequence[int], dst: Sequence[Buffer], /
    ) -> tuple[bool, float]:
        """Writes the weights the step computes on into dst (writable,
        contiguous buffers of the job's dtype, one per tensor index); returns
        (whether dst changed, the loss scale of those weights). With an
        embedded server, a pull of some of the job's tensors may return
        before the version is the job's (job_status may show the one
        before); a pull of every tensor returns once it is."""
    @property
    def last_pulled_version(self) -> int:
        """The version the last pull_for_step brought or found unchanged (-1:
        none yet, or it failed)."""
    def step_compensation(
        self, step: int, have_before: bool
    ) -> list[tuple[float, float, float]]:
        """zo.dpu.compensation "worker": per tensor, the coefficients (last,
        before, grad) of the weights the step after `step` computes on
        (last * a + before * b - grad * c); have_before: the caller holds the
        version before the last one pulled."""
    def job_status(self) -> _JobStatus:
        """The lead server's view of the job."""
    def traffic(self) -> _Traffic:
        """Gradient bytes pushed and weight bytes pulled by this client so
        far, and of the pushed, those taken from where their server reads
        them (no copy)."""
    def checkpoint(self, min_version: int = 0) -> str:
        """Checkpoints the job at its current version, or once it reaches
        min_version (a step just pushed); returns the committed directory."""
    def restore(self, path: str = "") -> int:
        """Restores a checkpoint (the latest when path is ""); returns its version."""
    def moved(self) -> bool:
        """Whether the last failed call was answered "the job moved" (zo-ctl rescale)."""
    def follow(self) -> int:
        """Attaches to the servers the job moved to (waiting up to 5 minutes
        for them to reach the move's version); returns the version there."""
    def close(self) -> None:
        """Closes the connection; later calls raise RuntimeError."""

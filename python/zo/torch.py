"""zo for PyTorch: an optimizer whose state lives on zo's servers.

    model = MyModel()
    opt = zo.torch.OffloadOptimizer(model.named_parameters(), config="ds_config.json",
                                    servers=["10.0.0.5:7070"])  # None: an embedded server
    for batch in data:
        loss = model(batch)
        (loss * opt.loss_scale).backward()  # the scale is 1 without fp16
        opt.step()
        opt.zero_grad()

step() pushes every gradient to the servers (cast to the job's dtype: fp16
with "fp16": {"enabled": true}, bf16 with "bf16", else fp32), waits until
they are acknowledged, and writes the weights of the next step into each
parameter in place: the new ones, or with the delayed parameter update
("zo": {"dpu": {"enabled": true}}) those one step older. The servers run
the optimizer, the learning-rate schedule, clipping and loss scaling of the
config; an overflowing fp16 step is skipped there and the scale comes down.

A DeepSpeed training loop keeps its shape with initialize():

    engine, optimizer, _, scheduler = zo.torch.initialize(model=model, config="ds_config.json",
                                                          servers=[...])
    loss = engine(batch); engine.backward(loss); engine.step()
"""

import json
import os
import shutil
import tempfile
import warnings

import torch

from zo import _native

_JOB_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _load_config(config):
    """A DeepSpeed-style config as (JSON text, dict) from a dict, JSON text or a path."""
    if isinstance(config, dict):
        return json.dumps(config), config
    if isinstance(config, (str, os.PathLike)):
        text = str(config)
        if not text.lstrip().startswith("{"):
            with open(text, encoding="utf-8") as f:
                text = f.read()
        return text, json.loads(text)
    raise TypeError(f"config must be a dict, JSON text or a path, not {type(config).__name__}")


def _job_dtype(cfg):
    if cfg.get("fp16", {}).get("enabled", False):
        return "fp16"
    if cfg.get("bf16", {}).get("enabled", False):
        return "bf16"
    return "fp32"


def _check_parameters(named):
    """Refuses parameters zo cannot train, naming each: the job's manifest is
    made of them, and pulled weights are written into their memory in place."""
    seen = set()
    for name, p in named:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"parameter '{name}' is a {type(p).__name__}, not a tensor")
        if name in seen:
            raise ValueError(f"parameter name '{name}' appears twice: the job's manifest "
                             "needs one name per tensor")
        seen.add(name)
        if p.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"parameter '{name}' is {p.dtype}: zo trains float32, float16 "
                            "and bfloat16 parameters")
        if p.layout != torch.strided:
            raise TypeError(f"parameter '{name}' is {p.layout}: zo trains dense parameters")
        if not p.is_contiguous():
            raise ValueError(f"parameter '{name}' is not contiguous (shape {list(p.shape)}, "
                             f"strides {list(p.stride())}): zo writes weights into a "
                             "parameter's memory in place; make it contiguous before "
                             "building the optimizer")


def _raw(t):
    """A writable buffer over a contiguous CPU tensor's memory (bf16 as int16)."""
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy()


class OffloadOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer whose step runs on zo's offload servers.

    named_parameters: model.named_parameters() (names form the job's manifest,
        so every worker of a job must name them alike).
    config: the DeepSpeed-style config (dict, JSON text or path).
    servers: "host:port" of every server, in the same order on every worker;
        None runs an embedded server inside this process.
    checkpoint_dir: where the embedded server writes checkpoints
        (state_dict() needs one); remote servers use their own.
    """

    def __init__(self, named_parameters, config, servers=None, job="zo-torch", dp_rank=0,
                 dp_world_size=1, checkpoint_dir="", auth_token=""):
        named = list(named_parameters)
        if not named:
            raise ValueError("OffloadOptimizer got no parameters")
        if not all(isinstance(item, tuple) and len(item) == 2 for item in named):
            raise TypeError("OffloadOptimizer takes model.named_parameters() (name, tensor) "
                            "pairs: the names make the job's manifest")
        _check_parameters(named)
        config_json, cfg = _load_config(config)
        for warning in _native.config_warnings(config_json, dp_world_size):
            warnings.warn(f"zo config: {warning}", stacklevel=2)
        if (cfg.get("zo", {}).get("gradient_accumulation") == "servers"
                and cfg.get("gradient_accumulation_steps", 1) != 1):
            raise NotImplementedError(
                'zo.torch sums micro-batch gradients in the model\'s .grad and pushes once per '
                'step; zo.gradient_accumulation "servers" (a push per micro-batch) is zo-train\'s '
                'GPU worker only: use "device" or "auto"')
        lr = cfg.get("optimizer", {}).get("params", {}).get("lr", 1e-3)
        super().__init__([p for _, p in named], {"lr": lr})
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._dp_rank = dp_rank
        self._dp_world_size = dp_world_size
        self._dtype_name = _job_dtype(cfg)
        self._dtype = _JOB_DTYPES[self._dtype_name]
        manifest = [(n, list(p.shape), self._dtype_name) for n, p in named]
        self._opened_as = [(tuple(p.shape), p.dtype, p.device) for p in self._params]
        self._server = None
        if servers is None:
            self._server = _native.EmbeddedServer(checkpoint_dir or "")
        try:
            self._client = _native.Client(config_json, manifest, list(servers or []),
                                          self._server, job, dp_rank, dp_world_size, auth_token)
        except RuntimeError:
            if self._server is not None:
                self._server.shutdown()
            raise
        # Parameters the client reads and writes directly (CPU, contiguous, the
        # job's dtype); the others go through a staging copy.
        self._staging = [None if self._direct(p) else
                         torch.empty(p.shape, dtype=self._dtype,
                                     pin_memory=p.is_cuda and torch.cuda.is_available())
                         for p in self._params]
        self._grad_staging = [None] * len(self._params)  # CUDA gradients, made when first needed
        self.loss_scale = 1.0
        self._pushed = set()  # parameters whose gradient for the next step is out
        if self._client.version == 0:
            for i, p in enumerate(self._params):
                values = p.detach().to("cpu", torch.float32).contiguous()
                self._client.init_params(i, values.numpy())
        self._step = self._client.version
        self._load(self._step + 1)

    def _direct(self, p):
        return p.device.type == "cpu" and p.dtype == self._dtype and p.is_contiguous()

    @property
    def global_steps(self):
        """Steps the servers have taken for this job (the job's version)."""
        return self._step

    def _load(self, step):
        """Writes the weights `step` computes on into the parameters."""
        buffers = [_raw(p.data if s is None else s) for p, s in zip(self._params, self._staging)]
        try:
            changed, self.loss_scale = self._client.pull_for_step(
                step, list(range(len(self._params))), buffers)
        except RuntimeError:
            if not self._client.moved():
                raise
            self._client.follow()  # it moved at the version this step needs: pull it there
            changed, self.loss_scale = self._client.pull_for_step(
                step, list(range(len(self._params))), buffers)
        if changed:
            with torch.no_grad():
                for p, s in zip(self._params, self._staging):
                    if s is not None:
                        p.copy_(s)

    def _stage_from_device(self, index, grad):
        """A CUDA gradient cast on the device and copied into a page-locked
        buffer kept for this parameter: a DMA, no pageable bounce. The buffer
        is free again by the next step (finish_step waits for its bytes)."""
        if self._grad_staging[index] is None:
            self._grad_staging[index] = torch.empty(grad.shape, dtype=self._dtype,
                                                    pin_memory=True)
        staging = self._grad_staging[index]
        staging.copy_(grad.detach().to(self._dtype), non_blocking=True)
        torch.cuda.current_stream(grad.device).synchronize()
        return staging

    @torch.no_grad()
    def push_gradient(self, index, grad):
        """Pushes parameter `index`'s final gradient for the next step now (the
        engine does this from autograd hooks during the last backward); step()
        then pushes only the others."""
        if grad is None:
            grad = torch.zeros(self._params[index].shape, dtype=self._dtype)
        elif grad.is_cuda:
            grad = self._stage_from_device(index, grad)
        else:
            grad = grad.detach().to(self._dtype).contiguous()  # no copy when it already is
        try:
            self._client.push(self._step + 1, index, _raw(grad))
        except RuntimeError:
            if not self._client.moved():
                raise
            return  # step() follows the job and pushes this gradient again
        self._pushed.add(index)

    def _check_unchanged(self):
        """The job's manifest is fixed when it opens: a parameter resized,
        retyped or moved since then cannot be trained by it."""
        for name, p, (shape, dtype, device) in zip(self._names, self._params, self._opened_as):
            now = (tuple(p.shape), p.dtype, p.device)
            if now != (shape, dtype, device) or not p.is_contiguous():
                raise RuntimeError(
                    f"parameter '{name}' changed since the job was opened: it was "
                    f"{list(shape)} {dtype} on {device}, it is {list(p.shape)} {p.dtype} on "
                    f"{p.device}{'' if p.is_contiguous() else ', not contiguous'}; a job's "
                    "parameters are fixed: open a new job (another job= name) for the new model")

    @torch.no_grad()
    def step(self, closure=None):
        self._check_unchanged()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        step = self._step + 1
        while not self._push_step(step):
            # The job moved (zo-ctl rescale): attach where it went and push
            # this step there again, unless the move already took it.
            version = self._client.follow()
            self._pushed.clear()
            if version >= step:
                break
            if version < step - 1:
                # Restored to an older checkpoint: the weights go back there
                # and the next backward computes the step after it.
                warnings.warn(f"zo: the job moved back to version {version}: "
                              f"steps {version + 1}..{step - 1} are taken again", stacklevel=2)
                self._step = version
                self._load(version + 1)
                self._show_server_lr()
                return loss
        self._pushed.clear()
        self._step = step
        self._load(step + 1)
        self._show_server_lr()
        return loss

    def _push_step(self, step):
        """Pushes the gradients not out yet and finishes the step; False when
        the job turned out to have moved."""
        try:
            for i, p in enumerate(self._params):
                if i not in self._pushed:
                    self.push_gradient(i, p.grad)
            self._client.finish_step(step)
            return True
        except RuntimeError:
            if not self._client.moved():
                raise
            return False

    def _show_server_lr(self):
        """param_groups' lr: the rate of the servers' last applied step."""
        status = self._client.job_status()
        if status["version"] >= self._step and status["applied_steps"] > 0:
            for group in self.param_groups:
                group["lr"] = status["last_lr"]

    def state_dict(self):
        """A server checkpoint of the job at this step (every server writes its
        part); the dict names it."""
        path = self._client.checkpoint(self._step)
        return {"zo": {"checkpoint": path, "step": self._step},
                "param_groups": [{"lr": g["lr"]} for g in self.param_groups]}

    def load_state_dict(self, state_dict):
        """Rolls the job back to the checkpoint state_dict() named, weights included."""
        zo_state = state_dict.get("zo")
        if not zo_state or "checkpoint" not in zo_state:
            raise ValueError("not a zo OffloadOptimizer state_dict (no 'zo' checkpoint entry)")
        self._step = self._client.restore(zo_state["checkpoint"])
        self._load(self._step + 1)
        self._show_server_lr()
        for group, saved in zip(self.param_groups, state_dict.get("param_groups", [])):
            group["lr"] = saved["lr"]

    def close(self):
        """Ends the client (and the embedded server); the optimizer is unusable after."""
        self._client.close()
        if self._server is not None:
            self._server.shutdown()


class OffloadEngine:
    """The DeepSpeed engine's shape over an OffloadOptimizer (zo.torch.initialize).

    engine(batch) runs the model; engine.backward(loss) scales the loss by the
    fp16 loss scale and 1 / gradient_accumulation_steps; engine.step() steps
    the servers at each gradient accumulation boundary and is a no-op between.
    """

    def __init__(self, model, optimizer, cfg):
        self.module = model
        self.optimizer = optimizer
        micro = cfg.get("train_micro_batch_size_per_gpu")
        gas = cfg.get("gradient_accumulation_steps")
        total = cfg.get("train_batch_size")
        world = optimizer._dp_world_size
        if gas is None:
            gas = total // (micro * world) if total and micro else 1
        if micro is None:
            micro = total // (gas * world) if total else 1
        self._micro_batch = int(micro)
        self._gas = int(gas)
        self._micro_steps = 0
        self._cfg = cfg
        self.lr_scheduler = _ServerLr(optimizer)
        # During the last micro-batch's backward each gradient is pushed the
        # moment autograd has it (a hook on the parameter fires before the
        # gradient is added to .grad, so .grad + grad is the final sum), and
        # the push overlaps the rest of the backward.
        self._push_in_backward = False
        self._trained = {id(p) for p in optimizer._params}
        # Parameters left out of the job on purpose (model_parameters=).
        self._frozen = {n for n, p in model.named_parameters() if id(p) not in self._trained}
        for i, p in enumerate(optimizer._params):
            if p.requires_grad:
                p.register_hook(self._final_gradient_hook(i, p))

    def _final_gradient_hook(self, index, param):
        def hook(grad):
            if self._push_in_backward:
                self.optimizer.push_gradient(index, grad if param.grad is None else param.grad + grad)
        return hook

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def train(self, mode=True):
        self.module.train(mode)
        return self

    def eval(self):
        self.module.eval()
        return self

    def parameters(self, recurse=True):
        return self.module.parameters(recurse)

    def named_parameters(self, *args, **kwargs):
        return self.module.named_parameters(*args, **kwargs)

    def _check_same_parameters(self):
        """The job's manifest is fixed when it opens: a module added, removed or
        replaced since then cannot be trained by it."""
        named = list(self.module.named_parameters())
        now = [n for n, p in named if id(p) in self._trained]
        if now == self.optimizer._names and all(
                id(p) in self._trained or n in self._frozen or not p.requires_grad
                for n, p in named):
            return
        new = {n for n, p in named
               if p.requires_grad and id(p) not in self._trained and n not in self._frozen}
        gone = set(self.optimizer._names) - set(now)
        changes = [f"{what} {sorted(names)}" for what, names in
                   (("replaced", new & gone), ("added", new - gone), ("removed", gone - new))
                   if names]
        raise RuntimeError(
            f"the model's parameters changed since the job was opened ({'; '.join(changes)}): "
            "a job's parameters are fixed; open a new job (another job= name) for the new model")

    def backward(self, loss):
        self._check_same_parameters()
        self._push_in_backward = (self._micro_steps + 1) % self._gas == 0
        try:
            (loss * (self.optimizer.loss_scale / self._gas)).backward()
        finally:
            self._push_in_backward = False
        self._micro_steps += 1
        return loss

    def is_gradient_accumulation_boundary(self):
        return self._micro_steps % self._gas == 0

    def step(self):
        if self._micro_steps > 0 and self.is_gradient_accumulation_boundary():
            self.optimizer.step()
            self.optimizer.zero_grad()

    def zero_grad(self):
        self.optimizer.zero_grad()

    @property
    def global_steps(self):
        return self.optimizer.global_steps

    @property
    def micro_steps(self):
        return self._micro_steps

    def get_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups]

    def get_global_grad_norm(self):
        """The gradient norm of the servers' last step (before clipping)."""
        return self.optimizer._client.job_status()["last_grad_norm"]

    def was_step_applied(self):
        """False when the servers skipped the last step (an fp16 overflow)."""
        return not self.optimizer._client.job_status()["last_skipped"]

    def train_batch_size(self):
        return self._micro_batch * self._gas * self.world_size

    def fp16_enabled(self):
        return self.optimizer._dtype_name == "fp16"

    def bfloat16_enabled(self):
        return self.optimizer._dtype_name == "bf16"

    def zero_optimization_stage(self):
        return int(self._cfg.get("zero_optimization", {}).get("stage", 0))

    @property
    def global_rank(self):
        return self.optimizer._dp_rank

    @property
    def world_size(self):
        return self.optimizer._dp_world_size

    @property
    def local_rank(self):
        return int(os.environ.get("LOCAL_RANK", 0))

    @property
    def device(self):
        """Where the model's parameters are (DeepSpeed scripts move batches there)."""
        return next(self.module.parameters()).device

    def train_micro_batch_size_per_gpu(self):
        return self._micro_batch

    def gradient_accumulation_steps(self):
        return self._gas

    def save_checkpoint(self, save_dir, tag=None, client_state=None):
        """Checkpoints the job on its servers and records it under save_dir/tag
        (default tag global_stepN; save_dir/latest names the newest). An
        embedded server's checkpoint moves into save_dir/tag itself."""
        tag = str(tag) if tag is not None else f"global_step{self.global_steps}"
        target = os.path.join(save_dir, tag)
        path = self.optimizer._client.checkpoint(self.global_steps)
        os.makedirs(save_dir, exist_ok=True)
        if os.path.exists(target):
            shutil.rmtree(target)
        if self.optimizer._server is not None:
            shutil.move(path, target)
            path = os.path.abspath(target)
        else:
            os.makedirs(target)
        with open(os.path.join(target, "zo_engine.json"), "w", encoding="utf-8") as f:
            json.dump({"checkpoint": path, "global_steps": self.global_steps,
                       "micro_steps": self._micro_steps, "client_state": client_state or {}}, f)
        with open(os.path.join(save_dir, "latest"), "w", encoding="utf-8") as f:
            f.write(tag)
        return True

    def load_checkpoint(self, load_dir, tag=None, **_):
        """Rolls the job back to a save_checkpoint; returns (path, client_state)
        as DeepSpeed does, or (None, None) when load_dir holds none."""
        if tag is None:
            latest = os.path.join(load_dir, "latest")
            if not os.path.exists(latest):
                return None, None
            with open(latest, encoding="utf-8") as f:
                tag = f.read().strip()
        target = os.path.join(load_dir, str(tag))
        with open(os.path.join(target, "zo_engine.json"), encoding="utf-8") as f:
            saved = json.load(f)
        self.optimizer.load_state_dict({"zo": {"checkpoint": saved["checkpoint"]}})
        self._micro_steps = saved.get("micro_steps", 0)
        return target, saved.get("client_state", {})

    def __getattr__(self, name):
        # Only reached for what the engine lacks.
        raise AttributeError(
            f"zo.torch's engine has no '{name}': it offers DeepSpeed's training-loop calls "
            "(forward, backward, step, save_checkpoint, load_checkpoint, "
            "is_gradient_accumulation_boundary, global_steps, get_lr, get_global_grad_norm, "
            "was_step_applied, train_batch_size, train_micro_batch_size_per_gpu, "
            "gradient_accumulation_steps, fp16_enabled, bfloat16_enabled, "
            "zero_optimization_stage, global_rank, local_rank, world_size, device, "
            "lr_scheduler); the model is .module")


class _ServerLr:
    """The lr scheduler slot of initialize()'s result: the schedule runs on the
    servers (the config's "scheduler"); this only reports it."""

    def __init__(self, optimizer):
        self._optimizer = optimizer

    def get_last_lr(self):
        return [g["lr"] for g in self._optimizer.param_groups]

    get_lr = get_last_lr

    def step(self, *_):
        pass  # the servers advance the schedule with every applied step


def add_config_arguments(parser):
    """DeepSpeed's add_config_arguments: --deepspeed, --deepspeed_config, and
    zo's --zo_servers (host:port,...), which initialize(args=...) reads."""
    group = parser.add_argument_group("zo (DeepSpeed-style)")
    group.add_argument("--deepspeed", action="store_true",
                       help="accepted for DeepSpeed scripts; zo is always on")
    group.add_argument("--deepspeed_config", default=None, type=str,
                       help="the DeepSpeed-style JSON config")
    group.add_argument("--zo_servers", default=None, type=str,
                       help="zo-server addresses, host:port,... (default: an embedded server)")
    return parser


def init_distributed(dist_backend=None, **_):
    """DeepSpeed's init_distributed. zo's workers need no process group (the
    servers average the dp ranks' gradients); one is set up only when a
    launcher's environment asks for it (MASTER_ADDR and WORLD_SIZE), for the
    script's own collectives."""
    import torch.distributed as dist
    if dist.is_available() and not dist.is_initialized() and "MASTER_ADDR" in os.environ \
            and "WORLD_SIZE" in os.environ:
        backend = dist_backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend)


def _launcher_rank():
    """(rank, world size) from torchrun's or DeepSpeed's launcher, else (0, 1)."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


# initialize() arguments of DeepSpeed's that change nothing here.
_IGNORED_INITIALIZE_ARGS = {"dist_init_required", "distributed_port"}


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, config=None, config_params=None, servers=None, job="zo-torch",
               dp_rank=None, dp_world_size=None, checkpoint_dir=None, auth_token="", **kwargs):
    """DeepSpeed's initialize with zo's servers under it:

        engine, optimizer, _, scheduler = zo.torch.initialize(
            model=model, config="ds_config.json", servers=["host:7070", ...])

    The optimizer and the lr schedule come from the config and run on the
    servers, so optimizer=, lr_scheduler= and training_data= are refused.
    servers=None starts an embedded server in this process, unless
    args.zo_servers (add_config_arguments) names servers. dp_rank and
    dp_world_size default to the launcher's RANK and WORLD_SIZE.
    """
    refused = {"optimizer": optimizer, "lr_scheduler": lr_scheduler,
               "training_data": training_data}
    for name, value in refused.items():
        if value is not None:
            raise NotImplementedError(
                f"zo.torch.initialize({name}=...): the optimizer and its schedule run on zo's "
                "servers from the config's 'optimizer' and 'scheduler' sections, and data "
                "stays in your own loop; leave it out")
    unsupported = sorted(set(kwargs) - _IGNORED_INITIALIZE_ARGS)
    if unsupported:
        raise NotImplementedError(
            f"zo.torch.initialize does not take {', '.join(unsupported)} (zo trains data "
            "parallel only: no model-parallel unit, no data loader)")
    if servers is None and args is not None and getattr(args, "zo_servers", None):
        servers = args.zo_servers.split(",")
    launcher_rank, launcher_world = _launcher_rank()
    dp_rank = launcher_rank if dp_rank is None else dp_rank
    dp_world_size = launcher_world if dp_world_size is None else dp_world_size
    if model is None:
        raise ValueError("zo.torch.initialize needs model=")
    config = config if config is not None else config_params
    if config is None and args is not None:
        config = getattr(args, "deepspeed_config", None)
    if config is None:
        raise ValueError("zo.torch.initialize needs config= (a DeepSpeed-style config)")
    _, cfg = _load_config(config)
    named = list(model.named_parameters())
    if model_parameters is not None:
        wanted = {id(p) for p in model_parameters}
        named = [(n, p) for n, p in named if id(p) in wanted]
    if checkpoint_dir is None and servers is None:
        # save_checkpoint moves each checkpoint from here into its save_dir.
        checkpoint_dir = tempfile.mkdtemp(prefix="zo-checkpoints-")
    opt = OffloadOptimizer(named, config, servers=servers, job=job, dp_rank=dp_rank,
                           dp_world_size=dp_world_size, checkpoint_dir=checkpoint_dir or "",
                           auth_token=auth_token)
    engine = OffloadEngine(model, opt, cfg)
    return engine, opt, None, engine.lr_scheduler

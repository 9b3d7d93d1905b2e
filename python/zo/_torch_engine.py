"""The engine of zo.torch.initialize: DeepSpeed's engine calls over an
OffloadOptimizer (micro-batches counted, gradients pushed from backward's
hooks, checkpoints beside the module's own state), and the lr scheduler
slot it fills when the schedule runs on the servers."""

import json
import os
import shutil

import torch

from zo._torch_not_in_zo import _ENGINE_NAMES_ZO_LACKS, NotInZo


class OffloadEngine:
    """The DeepSpeed engine's shape over an OffloadOptimizer (zo.torch.initialize).

    engine(batch) runs the model; engine.backward(loss) scales the loss by the
    fp16 loss scale and 1 / gradient_accumulation_steps; engine.step() steps
    the servers at each gradient accumulation boundary and is a no-op between.
    """

    def __init__(self, model, optimizer, cfg, lr_scheduler=None):
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
        # A torch lr_scheduler the loop gave (stepped after each optimizer
        # step, as DeepSpeed's engine does), or the config's schedule, which
        # runs on the servers and is only reported.
        self.lr_scheduler = lr_scheduler if lr_scheduler is not None else _ServerLr(optimizer)
        self._client_scheduler = lr_scheduler is not None
        # During the last micro-batch's backward each gradient is pushed the
        # moment autograd has it, and the push overlaps the rest of the
        # backward. Gradients accumulate in .grad in place (zero_grad keeps
        # the buffers), so a step allocates nothing: with torch >= 2.1 a hook
        # after accumulation pushes .grad itself; before, a hook sees the new
        # part and pushes .grad + it, summed into a buffer kept per parameter.
        # On the same-host route the kept .grad lie in the server's region
        # (OffloadOptimizer._keep_grads_in_region): those pushes copy nothing.
        self._push_in_backward = False
        # The last backward's pushed gradients and their version counters:
        # engine.step() refuses a .grad changed since then, which the servers
        # would not see (or, read where it lies in a shared region, in part).
        self._pushed_grads = {}
        self._sent_in_backward = set()  # the hooks' pushes in the backward running now
        self._trained = {id(p) for p in optimizer._params}
        # Parameters left out of the job on purpose (model_parameters=) or frozen.
        self._frozen = {n for n, p in model.named_parameters() if id(p) not in self._trained}
        for i, p in enumerate(optimizer._params):
            if hasattr(p, "register_post_accumulate_grad_hook"):
                p.register_post_accumulate_grad_hook(self._accumulated_gradient_hook(i))
            else:
                p.register_hook(self._final_gradient_hook(i, p))
        optimizer._keep_grads_in_region()

    def _accumulated_gradient_hook(self, index):
        def hook(param):
            if self._push_in_backward:
                self.optimizer.push_gradient(index, param.grad, lend=True)
                self._sent_in_backward.add(index)
        return hook

    def _final_gradient_hook(self, index, param):
        def hook(grad):
            if self._push_in_backward:
                self.optimizer.push_gradient(index, grad, plus=param.grad, lend=True)
                self._sent_in_backward.add(index)
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
        self.optimizer._check_resumed()
        self._check_same_parameters()
        last = (self._micro_steps + 1) % self._gas == 0
        self._push_in_backward = last
        self._sent_in_backward = set()
        try:
            (loss * (self.optimizer.loss_scale / self._gas)).backward()
        finally:
            self._push_in_backward = False
        self._micro_steps += 1
        if last:
            params = self.optimizer._params
            self._pushed_grads = {
                i: (params[i].grad, params[i].grad._version)
                for i in self._sent_in_backward if params[i].grad is not None}
        return loss

    def _check_pushed_grads_unchanged(self):
        pushed, self._pushed_grads = self._pushed_grads, {}
        for i, (grad, version) in pushed.items():
            now = self.optimizer._params[i].grad
            if now is not grad or grad._version != version:
                raise RuntimeError(
                    f"parameter '{self.optimizer._names[i]}': its .grad changed between "
                    "engine.backward() and engine.step(), but backward had already sent it to "
                    "the servers, which would not see the change, or only part of it "
                    "(torch.nn.utils.clip_grad_norm_, for one): clip with the config's "
                    "gradient_clipping, and leave .grad as backward left it until engine.step()")

    def is_gradient_accumulation_boundary(self):
        return self._micro_steps % self._gas == 0

    def step(self):
        if self._micro_steps > 0 and self.is_gradient_accumulation_boundary():
            self._check_pushed_grads_unchanged()
            self.optimizer.step()
            self.optimizer._zero_grads_kept()
            if self._client_scheduler:
                self.lr_scheduler.step()

    def zero_grad(self):
        self.optimizer._zero_grads_kept()

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

    def _module_state(self):
        """What the servers do not hold: the module's buffers (BatchNorm
        statistics) and its parameters outside the job (frozen ones)."""
        return {"buffers": {n: b for n, b in self.module.named_buffers() if b is not None},
                "untrained": {n: p for n, p in self.module.named_parameters()
                              if id(p) not in self._trained}}

    def _restore_module_state(self, saved, target):
        with torch.no_grad():
            for kind, now in self._module_state().items():
                kept = saved[kind]
                if set(kept) != set(now):
                    raise ValueError(
                        f"checkpoint {target} holds the {kind} {sorted(kept)}, the model has "
                        f"{sorted(now)}: it was saved from another model")
                for name, t in now.items():
                    if t.shape != kept[name].shape or t.dtype != kept[name].dtype:
                        raise ValueError(f"checkpoint {target}: '{name}' is {list(kept[name].shape)}"
                                         f" {kept[name].dtype}, the model's is {list(t.shape)} "
                                         f"{t.dtype}")
                    t.copy_(kept[name])

    def save_checkpoint(self, save_dir, tag=None, client_state=None):
        """Checkpoints the job on its servers and records it under save_dir/tag
        (default tag global_stepN; save_dir/latest names the newest). An
        embedded server's checkpoint moves into save_dir/tag itself. Beside
        it, zo_module_state.pt keeps what the servers do not: the module's
        buffers, its parameters outside the job, param_groups' rates, a torch
        lr_scheduler's state and client_state (any picklable object)."""
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
        state = dict(self._module_state(), client_state=client_state or {},
                     param_groups=[{k: g[k] for k in ("lr", "initial_lr") if k in g}
                                   for g in self.optimizer.param_groups])
        if self._client_scheduler:
            state["lr_scheduler"] = self.lr_scheduler.state_dict()
        torch.save(state, os.path.join(target, "zo_module_state.pt"))
        with open(os.path.join(target, "zo_engine.json"), "w", encoding="utf-8") as f:
            json.dump({"checkpoint": path, "global_steps": self.global_steps,
                       "micro_steps": self._micro_steps}, f)
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
        module_file = os.path.join(target, "zo_module_state.pt")
        state = torch.load(module_file) if os.path.exists(module_file) else None
        if state is not None:
            self._restore_module_state(state, target)
        self.optimizer.load_state_dict({"zo": {"checkpoint": saved["checkpoint"]},
                                        "param_groups": (state or {}).get("param_groups", [])})
        if state is not None and self._client_scheduler and "lr_scheduler" in state:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self._micro_steps = saved.get("micro_steps", 0)
        if state is None:  # written before zo_module_state.pt existed
            return target, saved.get("client_state", {})
        return target, state["client_state"]

    def __getattr__(self, name):
        # Only reached for what the engine lacks.
        if name in _ENGINE_NAMES_ZO_LACKS:
            raise NotInZo(f"engine.{name}: {_ENGINE_NAMES_ZO_LACKS[name]}")
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

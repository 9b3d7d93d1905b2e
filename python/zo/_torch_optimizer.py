"""OffloadOptimizer: the torch.optim.Optimizer whose step runs on zo's
servers (zo.torch's docstring shows its loop). It opens the job from the
parameter groups and the config, pushes each step's gradients in the job's
dtype, writes the next weights into the parameters in place, follows a job
that moved, and checkpoints and restores through the servers."""

import inspect
import json
import warnings

import torch

from zo import _native
from zo._torch_compensation import DelayedStepCompensation
from zo._torch_config import _JOB_DTYPES, _job_dtype, _load_config, _optimizer_defaults
from zo._torch_device_copies import GradientDownloads, WeightUploads
from zo._torch_groups import _group_settings, _lr_value, _named_groups
from zo._torch_job import _default_job_name, _fingerprint, _owns_its_storage, _raw


# The keys of a group that a step may change (with _hyper_per_step).
_STEP_HYPER_KEYS = ("betas", "eps", "weight_decay")

# torch.optim's zero_grad default: set_to_none True since torch 2.0, False before.
_SET_TO_NONE = inspect.signature(torch.optim.Optimizer.zero_grad).parameters["set_to_none"].default


class OffloadOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer whose step runs on zo's offload servers.

    params: what torch.optim takes: model.named_parameters(), or parameter
        groups ({"params": [...], "lr": ..., "weight_decay": ..., "betas":
        ..., "eps": ...}) whose params are (name, tensor) pairs or tensors
        named through model=. Names form the job's manifest, so every worker
        of a job must name them alike. Parameters with requires_grad=False
        are not part of the job (any dtype; never sent, never decayed).
    config: the DeepSpeed-style config (dict, JSON text or path); its
        optimizer params are the groups' defaults.
    servers: "host:port" of every server (a list, or one string with
        commas), in the same order on every worker; None runs an embedded
        server inside this process.
    checkpoint_dir: where the embedded server writes checkpoints
        (state_dict() needs one); remote servers use their own.
    model: names bare tensors in params (its named_parameters()).
    job: the job's name on the servers; default: a new name per run (with
        dp ranks in separate processes, one from the launcher they share).
    resume: continue a job the servers already trained under that name,
        on their weights. Without it such a job is left as it is and the
        model keeps its own weights: step() refuses, naming the job, until
        load_state_dict() (or the engine's load_checkpoint) rolls it back
        to a checkpoint. A job at version 0 that another worker opened from
        other initial weights (another model or seed) is refused.

    The learning rate: without a "scheduler" section in the config, each
    step uses param_groups[i]["lr"] as the loop (or a torch lr_scheduler)
    last set it, as torch.optim does. With one, the servers' schedule sets
    it, param_groups shows it after each step, and a loop that writes it
    is refused. A group's betas, eps and weight_decay are fixed when the
    job opens: a later write (OneCycleLR's cycled betas) is refused.
    """

    def __init__(self, params, config, servers=None, job=None, dp_rank=0,
                 dp_world_size=1, checkpoint_dir="", auth_token="", model=None, resume=False):
        self._opened = False
        groups = _named_groups(params, model)
        config_json, cfg = _load_config(config)
        for warning in _native.config_warnings(config_json, dp_world_size):
            warnings.warn(f"zo config: {warning}", stacklevel=2)
        if (cfg.get("zo", {}).get("gradient_accumulation") == "servers"
                and cfg.get("gradient_accumulation_steps", 1) != 1):
            raise NotImplementedError(
                'zo.torch sums micro-batch gradients in the model\'s .grad and pushes once per '
                'step; zo.gradient_accumulation "servers" (a push per micro-batch) is zo-train\'s '
                'GPU worker only: use "device" or "auto"')
        zero = cfg.get("zero_optimization") or {}
        param_device = (zero.get("offload_param") or {}).get("device")
        if param_device not in (None, "none"):
            raise NotImplementedError(
                f'zero_optimization.offload_param.device = "{param_device}": zo.torch does not '
                'stream parameters (the weights are your module\'s, where you put them); only '
                "zo-train streams them. Remove offload_param")
        for key in ("param_groups", "client_lr"):
            if key in cfg.get("zo", {}):
                raise ValueError(f"config key zo.{key} is set by zo.torch from the optimizer's "
                                 "param_groups; leave it out")
        defaults = _optimizer_defaults(cfg)
        self._schedule_on_servers = "scheduler" in cfg
        if self._schedule_on_servers:
            for g, (hyper, _) in enumerate(groups):
                if "lr" in hyper and hyper["lr"] != defaults["lr"]:
                    raise ValueError(
                        f"parameter group {g} sets lr {hyper['lr']} while the config's scheduler "
                        "sets every group's rate: remove the group's lr, or the scheduler "
                        "section (then each group's lr is used as torch.optim uses it)")
        super().__init__([dict(hyper, params=[p for _, p in named]) for hyper, named in groups],
                         defaults)
        self._opened = True
        # The job's tensors: trainable parameters, group by group.
        trained = [(n, p, g) for g, (_, named) in enumerate(groups) for n, p in named
                   if p.requires_grad]
        if not trained:
            raise ValueError("OffloadOptimizer got no trainable parameters (every one has "
                             "requires_grad=False)")
        self._frozen = [(n, p) for _, named in groups for n, p in named if not p.requires_grad]
        self._names = [n for n, _, _ in trained]
        self._params = [p for _, p, _ in trained]
        self._dp_rank = dp_rank
        self._dp_world_size = dp_world_size
        self._dtype_name = _job_dtype(cfg)
        self._dtype = _JOB_DTYPES[self._dtype_name]
        job_cfg = json.loads(config_json)
        job_cfg.setdefault("zo", {})
        if not self._schedule_on_servers:
            job_cfg["zo"]["client_lr"] = True
        group_hyper = [{"betas": list(g["betas"]), "eps": g["eps"],
                        "weight_decay": g["weight_decay"]} for g in self.param_groups]
        # What each group opened the job with. A later write of betas, eps or
        # weight_decay (a scheduler cycling betas) goes to the servers with
        # the step's rates where they can take it, and is refused otherwise
        # (never ignored); so is one of the keys zo runs at their default.
        self._opened_hyper = [_group_settings(g) for g in self.param_groups]
        compensated = cfg.get("zo", {}).get("dpu", {}).get("compensation", "none") == "worker"
        self._why_hyper_fixed = (
            "the config's scheduler sets the job's rates on the servers" if self._schedule_on_servers
            else "zo.dpu.compensation's terms take the job's own betas and weight decay"
            if compensated else None)
        self._hyper_per_step = self._why_hyper_fixed is None
        default_hyper = {"betas": list(defaults["betas"]), "eps": defaults["eps"],
                         "weight_decay": defaults["weight_decay"]}
        if any(h != default_hyper for h in group_hyper) or len(group_hyper) > 1:
            job_cfg["zo"]["param_groups"] = group_hyper
        config_json = json.dumps(job_cfg)
        manifest = [(n, list(p.shape), self._dtype_name) for n, p, _ in trained]
        self._opened_as = [(tuple(p.shape), p.dtype, p.device) for p in self._params]
        if isinstance(servers, str):
            servers = [s.strip() for s in servers.split(",") if s.strip()]
        self.job = job if job is not None else _default_job_name(dp_world_size)
        fingerprint = _fingerprint(manifest, self._params)
        self._server = None
        if servers is None:
            self._server = _native.EmbeddedServer(checkpoint_dir or "")
        try:
            self._client = _native.Client(config_json, manifest, list(servers or []),
                                          self._server, self.job, dp_rank, dp_world_size,
                                          auth_token, [g for _, _, g in trained], fingerprint)
        except RuntimeError:
            if self._server is not None:
                self._server.shutdown()
            raise
        # zo.dpu.compensation "worker": the parameters get weights formed from
        # the versions pulled, which are kept apart (so never pulled into them).
        self._compensation = (DelayedStepCompensation(self._params, self._dtype)
                              if compensated else None)
        # Parameters the client reads and writes directly (CPU, contiguous, the
        # job's dtype); the others go through a staging copy.
        self._staging = [None if self._direct(p) and not compensated else
                         torch.empty(p.shape, dtype=self._dtype,
                                     pin_memory=p.is_cuda and torch.cuda.is_available())
                         for p in self._params]
        # Gradients in the job's dtype when the parameter's is another, made
        # once when first needed (page-locked for CUDA gradients).
        self._grad_staging = [None] * len(self._params)
        # What zo last wrote into each parameter, to tell a later write that
        # changed it from one that did not (_check_not_written): the staging
        # buffer holds it, else a few elements are kept (_written_sample).
        self._sampled = [s is None or compensated for s in self._staging]
        self._sample_at = [None] * len(self._params)
        self._checked_for = None  # the step whose first push checked them
        self._downloads = GradientDownloads()  # CUDA gradients not yet in host memory
        self._uploads = WeightUploads()  # CUDA weights still reading self._staging
        self._zero_grads = [None] * len(self._params)
        self._all = list(range(len(self._params)))
        self._pulled_into = None  # each parameter's data_ptr() when _buffers were made
        self._buffers = None
        self.loss_scale = 1.0
        self._pushed = set()  # parameters whose gradient for the next step is out
        self._lent = []  # (index, tensor) lent for the next step: the servers read them
        self._lr_sent = None  # (step, rates) sent to the servers for that step
        self._warned_no_grad = set()
        self._not_resumed = None  # why step() refuses: a trained job nobody asked to resume
        version = self._client.version
        if version == 0:
            for i, p in enumerate(self._params):
                values = p.detach().to("cpu", torch.float32).contiguous()
                self._client.init_params(i, values.numpy())
        elif not resume:
            same = self._client.job_status()["init_fingerprint"] == fingerprint
            self._not_resumed = (
                f"job '{self.job}' on the servers has taken {version} steps, started from "
                f"{'the same initial weights as this model (a rerun?)' if same else 'other initial weights than this model'}"
                ": continuing it would replace the model's weights with the servers'. Pass "
                "resume=True to continue it, roll it back to a checkpoint (load_state_dict, "
                "engine.load_checkpoint), or give another job= name (the default is a new one "
                "per run)")
        self._step = version
        # An fp16 job's loss scale is the servers' (self.loss_scale). Claiming
        # torch's amp-scaling hook makes a GradScaler call step() with its
        # found_inf set, instead of unscaling and skipping on its own, so
        # that step() sees the second scaler and refuses it.
        if self._dtype_name == "fp16":
            self._step_supports_amp_scaling = True
        self._moved_into_region = False
        # Whether zero_grad(set_to_none=False) may keep .grad in the region
        # (_zero_grads_kept): the weights moved there and every parameter is
        # of the job's dtype; the engine also needs a hook (_keep_grads_in_region).
        self._grads_in_region = all(p.dtype == self._dtype for p in self._params)
        # (step, {index: the .grad placed in the region for that step}), or
        # None: where _zero_grads_kept put the gradients.
        self._placed = None
        if not compensated:
            self._move_into_region()
        if self._not_resumed is None:
            self._load(self._step + 1)
        self._note_written()
        self._shown_lr = None
        self._show_server_lr()

    def add_param_group(self, param_group):
        if getattr(self, "_opened", False):
            raise NotImplementedError(
                "add_param_group: a zo job's tensors are fixed when the optimizer opens it (the "
                "servers shard them); give every parameter group to the constructor, or open a "
                "new optimizer (another job= name) for the larger model")
        super().add_param_group(param_group)

    def _move_into_region(self):
        """On the same-host route, a CPU model's weights in the job's dtype
        move into the shared region where its server writes pulled weights
        (p.data replaced, once, here), and an fp32 model's staging buffers
        are made there: each pull then writes them in place, with no copy
        out of the region. Only where every parameter can (one server per
        tensor, all on the CPU): a pull into other buffers would take gRPC.
        A parameter that is a view of a larger storage (a flat buffer the
        script keeps) stays where it is."""
        if not all(p.is_cpu for p in self._params):
            return
        places = self._client.region_pull_places(self._all)
        if not places:
            return
        with torch.no_grad():
            for i, (p, place) in enumerate(zip(self._params, places)):
                if place is None:  # no elements
                    continue
                there = torch.frombuffer(place, dtype=self._dtype).view(p.shape)
                if self._staging[i] is not None:
                    self._staging[i] = there
                elif _owns_its_storage(p):  # else a view of more: its pulls copy
                    there.copy_(p.data)
                    p.data = there
        self._moved_into_region = True

    def _follow(self):
        """Attaches where the job moved (zo-ctl rescale); returns its version.
        Weights that lived in the old server's region (and an fp32 model's
        staging buffers) move into the new one's, where its pulls write."""
        version = self._client.follow()
        self._placed = None  # lent by the servers left behind
        if self._moved_into_region:
            self._moved_into_region = False
            self._move_into_region()
            self._pulled_into = None  # staging buffers moved too: make the pull buffers again
        return version

    def _keep_grads_in_region(self):
        """For the engine, whose gradients stay in .grad between steps (zeroed,
        not freed) and are pushed from it by a hook after accumulation: where
        the weights moved into the shared region and every parameter is of
        the job's dtype, the gradients live in the region's gradient areas
        too, so that backward sums them where the server reads them and no
        push copies them. Needs torch's post-accumulate hook (2.1); before
        it, the engine pushes .grad + the new part from a buffer."""
        self._grads_in_region = (
            self._grads_in_region
            and hasattr(torch.Tensor, "register_post_accumulate_grad_hook"))

    def _zero_grads_kept(self):
        """zero_grad(set_to_none=False), the loop's or the engine's. Where
        the gradients may live in the region, each that exists moves, zeroed,
        to its place for the next step instead (the region's two gradient
        areas alternate by step, so that a server may still read the last
        step's); one with none stays without."""
        self._downloads.settle()
        indices = [i for i, p in enumerate(self._params) if p.grad is not None]
        places = []
        if self._grads_in_region and self._moved_into_region and indices:
            try:
                places = self._client.region_push_places(self._step + 1, indices)
            except RuntimeError:
                # A failed step's places still lent, or the job moved (the
                # step finds out): the gradients stay out of the region.
                places = []
        if not places:
            self._grads_out_of_region()
            torch.optim.Optimizer.zero_grad(self, set_to_none=False)
            return
        placed = {}
        with torch.no_grad():
            for i, place in zip(indices, places):
                p = self._params[i]
                if place is None:  # no elements
                    continue
                grad = torch.frombuffer(place, dtype=self._dtype).view(p.shape)
                grad.zero_()
                p.grad = grad
                placed[i] = grad
        self._placed = (self._step + 1, placed)

    def _grads_out_of_region(self):
        """Gradients placed in the region for a step that will not be pushed
        next (the job went back, or the next step's places were refused)
        move to memory of their own, until _zero_grads_kept places them
        again: a push copies them from there."""
        if self._placed is None:
            return
        self._placed = None
        with torch.no_grad():
            for p in self._params:
                if p.grad is not None:
                    p.grad = p.grad.clone()

    def _at_place(self, step, index, grad):
        """The gradient to push for parameter `index` at `step`: where its
        place in the region was lent for the step but .grad was replaced
        since (DistributedDataParallel's gradient_as_bucket_view, a backward
        with create_graph=True), copied into the place, which is pushed
        without a copy; a push from other bytes would take gRPC."""
        if self._placed is None or self._placed[0] != step:
            return grad
        place = self._placed[1].get(index)
        if place is None or grad.data_ptr() == place.data_ptr():
            return grad
        place.copy_(grad)
        return place

    def _direct(self, p):
        return p.device.type == "cpu" and p.dtype == self._dtype and p.is_contiguous()

    @property
    def global_steps(self):
        """Steps the servers have taken for this job (the job's version)."""
        return self._step

    def _load(self, step, after_step=False):
        """Writes the weights `step` computes on into the parameters;
        `after_step`: each .grad holds what was pushed for step - 1."""
        buffers = self._pull_buffers()
        self._uploads.wait()  # the last step's weights are out of the buffers
        try:
            changed, self.loss_scale = self._client.pull_for_step(step, self._all, buffers)
        except RuntimeError:
            if not self._client.moved():
                raise
            self._follow()  # it moved at the version this step needs: pull it there
            if self._compensation is not None:
                self._compensation.forget()
            buffers = self._pull_buffers()
            changed, self.loss_scale = self._client.pull_for_step(step, self._all, buffers)
        if self._compensation is not None:
            self._compensation.apply(self._client, step, self._staging, changed, self._params,
                                     after_step)
            self._uploads.uploaded({p.device for p in self._params if p.is_cuda})
        elif changed:
            if self._widened[0]:
                _native.widen(*self._widened)
            devices = set()
            with torch.no_grad():
                for p, s in self._copied:
                    # From page-locked memory on the compute stream: the
                    # forward after it reads the new weights, and the CPU
                    # goes on without waiting for the copy.
                    p.copy_(s, non_blocking=True)
                    if p.is_cuda:
                        devices.add(p.device)
            self._uploads.uploaded(devices)
        self._note_written()

    def _note_written(self):
        """Each parameter's version counter once zo has written it (an
        in-place write since then, model.load_state_dict or an init under
        no_grad, bumps it: _check_not_written), and a sample of what was
        written where no staging buffer keeps it."""
        self._written = [p._version for p in self._params]
        self._written_sample = [self._sample(i) if sampled else None
                                for i, sampled in enumerate(self._sampled)]

    def _sample(self, index):
        """Up to 16 elements of parameter `index`, spread over it."""
        p = self._params[index]
        at = self._sample_at[index]
        if at is None or at.device != p.device:
            n = p.numel()
            at = torch.linspace(0, max(n - 1, 0), steps=min(n, 16), device=p.device).long()
            self._sample_at[index] = at
        return p.detach().reshape(-1).index_select(0, at)

    def _still_as_written(self, index):
        """Whether parameter `index` holds what zo last wrote, as far as its
        staging buffer or its sample tells."""
        p = self._params[index]
        if self._sampled[index]:
            return torch.equal(self._sample(index), self._written_sample[index])
        staged = self._staging[index]
        return torch.equal(p.detach(), staged.to(device=p.device, dtype=p.dtype))

    def _check_not_written(self):
        """A parameter written in place since zo last wrote it, with other
        values: the servers hold its master weights, so the step's pull
        would silently replace them. A write of the same values (the
        broadcast of DistributedDataParallel wrapped after the optimizer
        was built) is let through. A write through .data bumps no counter
        and is not seen."""
        for index, (name, p, version) in enumerate(zip(self._names, self._params,
                                                       self._written)):
            if p._version == version:
                continue
            if self._still_as_written(index):
                self._written[index] = p._version
                continue
            raise RuntimeError(
                f"parameter '{name}' was written in place since zo last wrote it (a "
                "model.load_state_dict or an in-place init after the optimizer was built?): "
                "the servers hold its master weights, and the step's pull would replace "
                "what was written. Load or set the weights before building the optimizer, "
                "or roll the job back with optimizer.load_state_dict()")

    def _pull_buffers(self):
        """The buffers each pull writes: the parameters' own memory (or their
        staging copies), made again only when a parameter's memory moved
        (p.data replaced)."""
        where = [p.data_ptr() for p in self._params]
        if where != self._pulled_into:
            self._buffers = [_raw(p.data if s is None else s)
                             for p, s in zip(self._params, self._staging)]
            staged = [(p, s) for p, s in zip(self._params, self._staging) if s is not None]
            # A 16-bit job's weights into fp32 CPU parameters are widened on
            # every core in one call (copy_ runs on torch's threads, which a
            # script leaving the cores to the servers sets to one); the
            # others are copied.
            widens = [s.dtype != torch.float32 and p.dtype == torch.float32 and p.is_cpu
                      and p.is_contiguous() for p, s in staged]
            self._widened = ([s for (_, s), w in zip(staged, widens) if w],
                             [p.data for (p, _), w in zip(staged, widens) if w])
            self._copied = [ps for ps, w in zip(staged, widens) if not w]
            self._pulled_into = where
        return self._buffers

    def _stage_from_device(self, index, grad):
        """Queues a CUDA gradient, cast on the device, for a copy into a
        page-locked buffer kept for this parameter: a DMA, no pageable
        bounce. The buffer is free again by the next step (finish_step waits
        for its bytes)."""
        if self._grad_staging[index] is None:
            self._grad_staging[index] = torch.empty(grad.shape, dtype=self._dtype,
                                                    pin_memory=True)
        self._downloads.stage(index, grad.detach().to(self._dtype), self._grad_staging[index])

    def _push_arrived(self, step, wait=False):
        """Hands the client the staged CUDA gradients whose bytes are in host
        memory (with `wait`, all of them once they are)."""
        arrived = list(self._downloads.arrived(wait))
        if arrived:
            # In one call, lent as _push_rest's: each buffer is written again
            # only by the next step's backward, after this step's pull.
            indices = [i for i, _ in arrived]
            self._lent.extend(arrived)
            self._client.push_tensors(step, indices, [b for _, b in arrived], False, lend=True)
            self._pushed.update(indices)

    def _in_job_dtype(self, index, grad, plus=None):
        """A CPU gradient (plus `plus`, when given) as contiguous elements of
        the job's dtype: the tensor itself when it already is, else written
        into a buffer kept for the parameter (no allocation per step)."""
        if plus is None and grad.dtype == self._dtype and grad.is_contiguous():
            return grad.detach()
        if self._grad_staging[index] is None:
            self._grad_staging[index] = torch.empty(grad.shape, dtype=self._dtype)
        staging = self._grad_staging[index]
        if plus is None:
            staging.copy_(grad.detach())
        else:
            # One rounding of the fp32 (or parameter-dtype) sum, as .grad + grad then .to().
            torch.add(grad.detach(), plus.detach(), out=staging)
        return staging

    def _zeros(self, index):
        if self._zero_grads[index] is None:
            self._zero_grads[index] = torch.zeros(self._params[index].shape, dtype=self._dtype)
        return self._zero_grads[index]

    def _step_settings(self):
        """What param_groups say a step takes, as the servers are told it:
        each group's rate, and each group's (beta1, beta2, eps,
        weight_decay) where some group's differ from those the job opened
        with (else [], the job's own)."""
        rates = [_lr_value(g, i) for i, g in enumerate(self.param_groups)]
        hyper = []
        if self._hyper_per_step:
            now = [_group_settings(g) for g in self.param_groups]
            if any(n[k] != o[k] for n, o in zip(now, self._opened_hyper)
                   for k in _STEP_HYPER_KEYS):
                hyper = [(*n["betas"], n["eps"], n["weight_decay"]) for n in now]
        return rates, hyper

    def _send_lr(self, step):
        """With the rate from param_groups (no scheduler in the config): the
        rates (and betas, eps, weight decay) of `step`, to the servers
        before its first gradient."""
        if self._schedule_on_servers or (self._lr_sent is not None and self._lr_sent[0] == step):
            return
        rates, hyper = self._step_settings()
        self._client.set_step_lr(step, rates, hyper)
        self._lr_sent = (step, rates, hyper)

    def _check_lr(self, step):
        """The rates a step uses are those param_groups hold when it is taken."""
        if self._schedule_on_servers:
            for i, g in enumerate(self.param_groups):
                if self._shown_lr is not None and g["lr"] != self._shown_lr[i]:
                    raise RuntimeError(
                        f"param_groups[{i}]['lr'] was set to {g['lr']}, but the config's "
                        "scheduler sets the learning rate on the servers: remove the config's "
                        "scheduler section to set it from the loop (or a torch lr_scheduler)")
            return
        rates, hyper = self._step_settings()
        if self._lr_sent is None or self._lr_sent[0] != step:
            return
        if self._lr_sent[1] != rates:
            raise RuntimeError(
                f"param_groups' lr changed to {rates} after backward sent step {step}'s "
                f"gradients with {self._lr_sent[1]}: set the learning rate before backward")
        if self._lr_sent[2] != hyper:
            raise RuntimeError(
                f"param_groups' betas, eps or weight_decay changed after backward sent step "
                f"{step}'s gradients: set them before backward")

    def _check_resumed(self):
        if self._not_resumed is not None:
            raise RuntimeError(self._not_resumed)

    def _check_no_grad_scaler(self):
        """torch's GradScaler.step() sets found_inf (and grad_scale) on an
        optimizer that claims _step_supports_amp_scaling: an fp16 job's."""
        if getattr(self, "found_inf", None) is None:
            return
        del self.found_inf  # as the scaler leaves them after a step
        if hasattr(self, "grad_scale"):
            del self.grad_scale
        raise RuntimeError(
            "a torch GradScaler is stepping this optimizer, but the job is fp16 (the config's "
            "fp16 section), whose loss scale zo's servers keep (opt.loss_scale): two scalers "
            "would unscale the gradients twice. Use one: drop the GradScaler and call "
            "(loss * opt.loss_scale).backward(), as DeepSpeed's fp16 does, or keep the "
            "GradScaler with a bf16 or fp32 job (remove the config's fp16 section)")

    def _check_group_settings(self):
        """The keys zo runs only at their default are the job's from when it
        opened, and so are a group's betas, eps and weight_decay where the
        servers cannot take them per step (_hyper_per_step): a write since
        then would be silently ignored, so it is refused before anything of
        the step is sent."""
        for g, (group, opened) in enumerate(zip(self.param_groups, self._opened_hyper)):
            now = _group_settings(group)
            for key, value in opened.items():
                if now[key] == value or (self._hyper_per_step and key in _STEP_HYPER_KEYS):
                    continue
                if key not in _STEP_HYPER_KEYS:
                    raise RuntimeError(
                        f"param_groups[{g}]['{key}'] was set to {group.get(key)}: zo runs "
                        f"{key}={value} only; leave it as it was")
                cycled = (" (torch's OneCycleLR and CyclicLR cycle betas[0] unless built with "
                          "cycle_momentum=False)" if key == "betas" else "")
                raise RuntimeError(
                    f"param_groups[{g}]['{key}'] was set to {group.get(key)}, but the job opened "
                    f"with {value}{cycled}: {self._why_hyper_fixed}, so its servers keep each "
                    "group's betas, eps and weight_decay as the optimizer opened the job; leave "
                    "them as they were, or open a new job (another job= name) with the new "
                    "values")

    def _check_frozen(self):
        for name, p in self._frozen:
            if p.requires_grad:
                raise RuntimeError(
                    f"parameter '{name}' was frozen (requires_grad=False) when the optimizer "
                    "opened its job, so it is not part of it, and it is trainable now: build "
                    "a new optimizer (another job= name) to train it")

    @torch.no_grad()
    def push_gradient(self, index, grad, plus=None, lend=False):
        """Pushes parameter `index`'s final gradient (grad + plus, when plus
        is given) for the next step now, or for a CUDA gradient once its copy
        to host memory is done (the engine does this from autograd hooks
        during the last backward); step() then pushes only the others.
        `lend`: a CPU gradient is not written again before step() returns
        (the engine's .grad, zeroed only after it), so an embedded server
        reads it where it lies instead of copying it."""
        self._check_resumed()
        self._check_dense(index, grad)
        step = self._step + 1
        if self._checked_for != step:  # once per step, not once per tensor
            self._check_group_settings()
            self._check_not_written()
            self._checked_for = step
        self._send_lr(step)
        if grad is None:
            name = self._names[index]
            if name not in self._warned_no_grad:
                self._warned_no_grad.add(name)
                warnings.warn(f"zo: parameter '{name}' has no gradient at step {step}: the "
                              "servers step it with a zero gradient (its moments decay and "
                              "weight decay applies), where torch.optim would skip it; freeze "
                              "it (requires_grad=False) before building the optimizer to keep "
                              "it out of the job", stacklevel=3)
        # An fp32 gradient for a 16-bit job is rounded by the client straight
        # into where its server reads it (no staging tensor, no GIL held).
        converted = (grad is not None and not grad.is_cuda and plus is None
                     and grad.dtype == torch.float32 and self._dtype != torch.float32)
        if grad is None:
            grad = self._zeros(index)
        elif grad.is_cuda:
            self._stage_from_device(index, grad if plus is None else grad + plus)
        elif not converted:
            grad = self._at_place(step, index, self._in_job_dtype(index, grad, plus))
        try:
            if converted:
                self._client.push_converted(step, index, grad.detach().contiguous().numpy())
                self._pushed.add(index)
            elif not grad.is_cuda and lend:
                self._lent.append((index, grad))
                self._client.push_tensors(step, [index], [grad], False, lend=True)
                self._pushed.add(index)
            elif not grad.is_cuda:  # a CUDA one goes once its copy has arrived
                self._client.push(step, index, _raw(grad))
                self._pushed.add(index)
            self._push_arrived(step)
        except RuntimeError:
            self._downloads.discard()
            if not self._client.moved():
                raise
            # step() follows the job and pushes the gradients not out again

    def _check_dense(self, index, grad):
        if grad is not None and grad.layout != torch.strided:
            raise RuntimeError(
                f"parameter '{self._names[index]}' has a {grad.layout} gradient (an "
                "nn.Embedding or EmbeddingBag with sparse=True?): zo's servers take dense "
                "gradients; build the module with sparse=False")

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
        self._check_no_grad_scaler()
        self._check_resumed()
        self._check_unchanged()
        self._check_frozen()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads = [p.grad for p in self._params]
        sparse = [i for i, g in enumerate(grads) if g is not None and g.layout != torch.strided]
        if sparse:  # before anything is pushed
            self._check_dense(sparse[0], grads[sparse[0]])
        step = self._step + 1
        self._check_lr(step)
        self._check_group_settings()
        self._check_not_written()
        try:
            return self._step_on(step, grads, loss)
        except BaseException:
            self._let_go_of_lent()
            raise
        finally:
            self._lent = []

    def _step_on(self, step, grads, loss):
        """step()'s pushes, finish and pull of `step`."""
        while not self._push_step(step, grads):
            # The job moved (zo-ctl rescale): attach where it went and push
            # this step there again, unless the move already took it.
            version = self._follow()
            self._pushed.clear()
            self._lr_sent = None  # the new lead has not heard them
            if version >= step:
                break
            if version < step - 1:
                # Restored to an older checkpoint: the weights go back there
                # and the next backward computes the step after it.
                warnings.warn(f"zo: the job moved back to version {version}: "
                              f"steps {version + 1}..{step - 1} are taken again", stacklevel=2)
                self._step = version
                self._grads_out_of_region()
                if self._compensation is not None:
                    self._compensation.forget()
                self._load(version + 1)
                self._show_server_lr()
                return loss
        self._pushed.clear()
        self._step = step
        self._load(step + 1, after_step=True)
        self._show_server_lr()
        return loss

    def _let_go_of_lent(self):
        """A step that failed after lending gradients: the servers may read
        them until their update ends, so the parameters and staging buffers
        get fresh ones and what the loop writes next cannot reach them
        (nor _at_place: the places are not written again this step)."""
        self._placed = None
        with torch.no_grad():
            for index, tensor in self._lent:
                p = self._params[index]
                if p.grad is tensor:
                    p.grad = tensor.clone()
                if self._grad_staging[index] is tensor:
                    self._grad_staging[index] = None
    def _push_step(self, step, grads):
        """Pushes the gradients not out yet (grads: each parameter's) and
        finishes the step; False when the job turned out to have moved."""
        try:
            self._push_arrived(step, wait=True)  # those the backward staged
            self._push_rest(step, grads)
            self._push_arrived(step, wait=True)
            self._client.finish_step(step)
            return True
        except RuntimeError:
            self._downloads.discard()
            if not self._client.moved():
                raise
            return False

    def _push_rest(self, step, grads):
        """Pushes the gradients not pushed yet: contiguous CPU ones of the
        job's dtype (sent from their memory), and float32 ones of a 16-bit
        job (rounded into where their servers read them), in one native
        call each; the others (none, CUDA, another dtype) one by one."""
        self._send_lr(step)
        rest = [(i, g) for i, g in enumerate(grads) if i not in self._pushed]
        plain = [(i, g) for i, g in rest if g is not None and g.is_cpu and g.is_contiguous()]
        same = [(i, self._at_place(step, i, g)) for i, g in plain if g.dtype == self._dtype]
        wide = ([(i, g) for i, g in plain if g.dtype == torch.float32]
                if self._dtype != torch.float32 else [])
        for batch, convert in ((same, False), (wide, True)):
            if batch:
                indices = [i for i, _ in batch]
                # Lent: step() returns once the step's weights are pulled,
                # by when the servers have read them (the client copies
                # under a delayed update, whose step returns sooner).
                if not convert:
                    self._lent.extend(batch)
                self._client.push_tensors(step, indices, [g for _, g in batch], convert,
                                          lend=True)
                self._pushed.update(indices)
        for i, g in rest:
            if i not in self._pushed:
                self.push_gradient(i, g)

    def _show_server_lr(self):
        """With the config's scheduler: param_groups' lr is the rate of the
        servers' last applied step. Otherwise param_groups' lr is the loop's."""
        if not self._schedule_on_servers:
            return
        status = self._client.job_status()
        if status["version"] >= self._step and status["applied_steps"] > 0:
            for group in self.param_groups:
                group["lr"] = status["last_lr"]
        self._shown_lr = [g["lr"] for g in self.param_groups]

    def state_dict(self):
        """A server checkpoint of the job at this step (every server writes its
        part); the dict names it, with each group's lr (and a torch
        lr_scheduler's initial_lr)."""
        path = self._client.checkpoint(self._step)
        return {"zo": {"checkpoint": path, "step": self._step},
                "param_groups": [{k: g[k] for k in ("lr", "initial_lr") if k in g}
                                 for g in self.param_groups]}

    def load_state_dict(self, state_dict):
        """Rolls the job back to the checkpoint state_dict() named, weights included."""
        zo_state = state_dict.get("zo")
        if not zo_state or "checkpoint" not in zo_state:
            raise ValueError("not a zo OffloadOptimizer state_dict (no 'zo' checkpoint entry)")
        self._step = self._client.restore(zo_state["checkpoint"])
        self._grads_out_of_region()
        self._not_resumed = None  # rolled back: the weights are the checkpoint's
        self._lr_sent = None
        if self._compensation is not None:
            self._compensation.forget()
        self._load(self._step + 1)
        self._show_server_lr()
        for group, saved in zip(self.param_groups, state_dict.get("param_groups", [])):
            group.update(saved)
        if self._schedule_on_servers:
            self._shown_lr = [g["lr"] for g in self.param_groups]

    def zero_grad(self, set_to_none=_SET_TO_NONE):
        """As torch.optim's. With set_to_none=False on the same-host route,
        each gradient is zeroed in the place of the shared region its server
        reads (a new tensor there, not the old one zeroed): backward sums
        into it and step() copies nothing (_zero_grads_kept)."""
        if not set_to_none:
            self._zero_grads_kept()
            return
        # A gradient still being copied out is read by that copy.
        self._downloads.settle()
        super().zero_grad(set_to_none=True)

    def close(self):
        """Ends the client (and the embedded server); the optimizer is unusable after."""
        self._downloads.discard()
        self._uploads.wait()
        self._client.close()
        if self._server is not None:
            self._server.shutdown()

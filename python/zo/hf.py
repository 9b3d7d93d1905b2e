"""zo for Hugging Face: transformers.Trainer with the optimizer on zo's servers.

    from zo.hf import ZoTrainer

    trainer = ZoTrainer(model=model, args=TrainingArguments(...), train_dataset=data,
                        zo_servers=["10.0.0.5:7070"])  # None: an embedded server
    trainer.train()

ZoTrainer is a transformers.Trainer whose create_optimizer() builds a
zo.torch.OffloadOptimizer from the parameter groups the Trainer builds for
its own AdamW (weight decay on the names get_decay_parameter_names gives,
none on biases and norms) with TrainingArguments' learning_rate,
adam_beta1/2, adam_epsilon and weight_decay. The rest is the Trainer's:
its lr scheduler writes each group's rate, which the servers use at the
next step; it clips (max_grad_norm) before step() pushes the gradients;
fp16/bf16 autocast runs with fp32 parameters and the job stays fp32.
Settings zo cannot honour are refused, naming them.

transformers is imported when this module is: `import zo` and
`import zo.torch` never need it.
"""

import os
import shutil
import tempfile

import torch

try:
    import transformers
except ImportError as e:  # say what to install, not only what is missing
    raise ImportError("zo.hf needs transformers (and accelerate, which its Trainer uses): "
                      "pip install transformers accelerate") from e

import zo.torch

# TrainingArguments.optim values that mean torch's AdamW, which the servers run.
_ADAMW = {"adamw_torch", "adamw_torch_fused", "adamw_hf"}
# Where a checkpoint of the embedded server goes inside a Trainer checkpoint folder.
CHECKPOINT_SUBDIR = "zo_checkpoint"
_OPTIMIZER_FILE = "optimizer.pt"  # transformers' OPTIMIZER_NAME


def _refuse_unsupported(args):
    """Raises for TrainingArguments zo cannot honour, naming the setting."""
    optim = str(getattr(args.optim, "value", args.optim))
    if optim not in _ADAMW:
        raise ValueError(f"TrainingArguments(optim={optim!r}): zo's servers run AdamW; use "
                         "optim='adamw_torch' (or 'adamw_torch_fused') with ZoTrainer, or "
                         "transformers.Trainer for another optimizer")
    if getattr(args, "optim_args", None):
        raise ValueError(f"TrainingArguments(optim_args={args.optim_args!r}): zo's AdamW takes "
                         "adam_beta1, adam_beta2, adam_epsilon and weight_decay only")
    if getattr(args, "optim_target_modules", None):
        raise ValueError("TrainingArguments(optim_target_modules=...) is for GaLore-style "
                         "optimizers; zo's servers run AdamW on every trainable parameter")
    if getattr(args, "deepspeed", None):
        raise ValueError("TrainingArguments(deepspeed=...): ZoTrainer offloads the optimizer to "
                         "zo's servers itself; leave deepspeed out (zo_config= takes a "
                         "DeepSpeed-style config for the servers)")
    if getattr(args, "fsdp", None):
        raise ValueError(f"TrainingArguments(fsdp={args.fsdp!r}): zo keeps the whole model on "
                         "each worker and the optimizer state on the servers; leave fsdp out")
    if args.world_size > 1:
        raise NotImplementedError(
            f"ZoTrainer runs one process (TrainingArguments.world_size is {args.world_size}): "
            "zo's dp ranks average on the servers, not through the Trainer's DDP; train "
            "several ranks with zo.torch.initialize")


def _config_from_args(args):
    """The DeepSpeed-style job config TrainingArguments describe: AdamW, fp32."""
    return {"train_batch_size": args.per_device_train_batch_size * args.gradient_accumulation_steps,
            "train_micro_batch_size_per_gpu": args.per_device_train_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "optimizer": {"type": "AdamW", "params": {
                "lr": args.learning_rate, "betas": [args.adam_beta1, args.adam_beta2],
                "eps": args.adam_epsilon, "weight_decay": args.weight_decay}}}


def _check_config(cfg, args):
    """Refuses a zo config that fights the Trainer's loop."""
    if "scheduler" in cfg:
        raise ValueError("zo config has a 'scheduler' section: under the Trainer its "
                         "lr_scheduler_type sets the rate; remove the section")
    if cfg.get("fp16", {}).get("enabled", False):
        raise ValueError("zo config enables fp16: its loss scale must multiply the loss, which "
                         "the Trainer does not do; use TrainingArguments(fp16=True) (autocast "
                         "and the Trainer's own loss scaling, the job stays fp32)")
    if cfg.get("gradient_clipping") and args.max_grad_norm:
        raise ValueError(f"zo config sets gradient_clipping {cfg['gradient_clipping']} and "
                         f"TrainingArguments sets max_grad_norm {args.max_grad_norm}: clip once "
                         "(max_grad_norm=0 to clip on the servers)")
    kind = cfg.get("optimizer", {}).get("type", "AdamW")
    if kind.lower() != "adamw":
        raise ValueError(f"zo config's optimizer type is {kind!r}: the Trainer's groups are "
                         "AdamW's (decoupled weight decay); use 'AdamW'")
    given = cfg.get("optimizer", {}).get("params", {})
    want = _config_from_args(args)["optimizer"]["params"]
    for key, value in given.items():
        if key in want and (list(value) if key == "betas" else value) != want[key]:
            raise ValueError(f"zo config's optimizer.params.{key} is {value}, TrainingArguments "
                             f"say {want[key]}: the Trainer's parameter groups carry "
                             "TrainingArguments'; leave it out of the config or make them agree")


class ZoTrainer(transformers.Trainer):
    """transformers.Trainer with zo.torch.OffloadOptimizer as its optimizer.

    zo_config: the job's DeepSpeed-style config (dict, JSON text or path);
        default: AdamW from TrainingArguments, fp32, no clipping on the
        servers (the Trainer clips). A config with a 'scheduler' section or
        fp16 enabled is refused (the Trainer schedules and scales).
    zo_servers: "host:port" of every zo-server (a list or one comma-separated
        string); None runs an embedded server in this process.
    zo_job, zo_auth_token: OffloadOptimizer's job= and auth_token=.
    zo_checkpoint_dir: where the embedded server writes checkpoints
        (default: a new temporary folder); each save_steps checkpoint is
        moved into the Trainer's checkpoint-N/zo_checkpoint.

    Every other argument is the Trainer's; optimizers= may carry a
    scheduler, not an optimizer.
    """

    def __init__(self, *args, zo_config=None, zo_servers=None, zo_job=None,
                 zo_checkpoint_dir=None, zo_auth_token="", **kwargs):
        super().__init__(*args, **kwargs)
        _refuse_unsupported(self.args)
        if self.optimizer is not None:
            raise ValueError("ZoTrainer(optimizers=(optimizer, ...)): ZoTrainer builds zo's "
                             "optimizer; pass optimizers=(None, scheduler), or give your own "
                             "optimizer to transformers.Trainer")
        if getattr(self, "optimizer_cls_and_kwargs", None) is not None:
            raise ValueError("ZoTrainer(optimizer_cls_and_kwargs=...): ZoTrainer builds zo's "
                             "optimizer; leave it out")
        if zo_config is None:
            self._zo_config = _config_from_args(self.args)
        else:
            _, self._zo_config = zo.torch._load_config(zo_config)
            _check_config(self._zo_config, self.args)
        self._zo_servers = zo_servers
        self._zo_job = zo_job
        self._zo_auth_token = zo_auth_token
        self._zo_checkpoint_dir = zo_checkpoint_dir

    @property
    def zo_optimizer(self):
        """The OffloadOptimizer under accelerate's wrapper (None before train())."""
        opt = self.optimizer
        while opt is not None and not isinstance(opt, zo.torch.OffloadOptimizer):
            opt = getattr(opt, "optimizer", None)
        return opt

    def create_optimizer(self, model=None):
        if self.optimizer is not None:
            return self.optimizer
        opt_model = self.model if model is None else model
        args = self.args
        decay = set(self.get_decay_parameter_names(opt_model))
        trainable = [(n, p) for n, p in opt_model.named_parameters() if p.requires_grad]
        hyper = {"lr": args.learning_rate, "betas": (args.adam_beta1, args.adam_beta2),
                 "eps": args.adam_epsilon}
        groups = [dict(hyper, params=[(n, p) for n, p in trainable if n in decay],
                       weight_decay=args.weight_decay),
                  dict(hyper, params=[(n, p) for n, p in trainable if n not in decay],
                       weight_decay=0.0)]
        checkpoint_dir = self._zo_checkpoint_dir
        if checkpoint_dir is None and self._zo_servers is None:
            checkpoint_dir = tempfile.mkdtemp(prefix="zo-checkpoints-")
        opt = zo.torch.OffloadOptimizer(
            [g for g in groups if g["params"]], self._zo_config, servers=self._zo_servers,
            job=self._zo_job, checkpoint_dir=checkpoint_dir or "",
            auth_token=self._zo_auth_token)
        # accelerate's wrapper, without its device placement: that moves the
        # optimizer's state through state_dict()/load_state_dict(), which for
        # zo is a server checkpoint and a restore (zo's state has no tensors).
        self.optimizer = self.accelerator.prepare(opt, device_placement=[False])
        return self.optimizer

    def _save_optimizer_and_scheduler(self, output_dir):
        """The Trainer's save, then the embedded server's checkpoint moves into
        output_dir/zo_checkpoint (deleted with it by save_total_limit)."""
        super()._save_optimizer_and_scheduler(output_dir)
        opt = self.zo_optimizer
        file = os.path.join(output_dir, _OPTIMIZER_FILE)
        if opt is None or opt._server is None or not os.path.isfile(file):
            return
        state = torch.load(file, weights_only=True)
        target = os.path.join(output_dir, CHECKPOINT_SUBDIR)
        if os.path.exists(target):
            shutil.rmtree(target)
        shutil.move(state["zo"]["checkpoint"], target)
        state["zo"]["checkpoint"] = os.path.abspath(target)
        torch.save(state, file)

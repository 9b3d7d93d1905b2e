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

import os
import tempfile

import torch

# zo.torch is the front door: the optimizer, the engine and what they stand
# on live in zo._torch_*, one concept a module; every name torch.py defined
# before they moved is still one of its attributes (zo.hf reads
# zo.torch._load_config).
from zo import _native  # noqa: F401
from zo._torch_config import (_JOB_DTYPES, _job_dtype, _load_config,  # noqa: F401
                              _optimizer_defaults)
from zo._torch_engine import OffloadEngine, _ServerLr  # noqa: F401
from zo._torch_groups import (_GROUP_DEFAULT_ONLY, _GROUP_KEYS, _check_parameter,  # noqa: F401
                              _lr_value, _named_groups)
from zo._torch_job import _default_job_name, _fingerprint, _raw  # noqa: F401
from zo._torch_not_in_zo import (_DEEPSPEED_NAMES_ZO_LACKS, _ENGINE_NAMES_ZO_LACKS,  # noqa: F401
                                 NotInZo)
from zo._torch_optimizer import OffloadOptimizer


def __getattr__(name):
    if name in _DEEPSPEED_NAMES_ZO_LACKS:
        raise NotInZo(_DEEPSPEED_NAMES_ZO_LACKS[name])
    raise AttributeError(f"module 'zo.torch' has no attribute '{name}'")


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
               lr_scheduler=None, config=None, config_params=None, servers=None, job=None,
               dp_rank=None, dp_world_size=None, checkpoint_dir=None, auth_token="", resume=False,
               **kwargs):
    """DeepSpeed's initialize with zo's servers under it:

        engine, optimizer, _, scheduler = zo.torch.initialize(
            model=model, config="ds_config.json", servers=["host:7070", ...])

    The optimizer comes from the config and runs on the servers, so
    optimizer= and training_data= are refused. model_parameters= may be
    parameters or torch.optim parameter groups (their own lr, betas, eps,
    weight_decay). lr_scheduler= (a torch lr_scheduler, or a callable that
    makes one from the optimizer) is stepped after each optimizer step and
    sets param_groups' lr, which the servers use; it is refused when the
    config has a scheduler section (that one runs on the servers).
    servers=None starts an embedded server in this process, unless
    args.zo_servers (add_config_arguments) names servers. dp_rank and
    dp_world_size default to the launcher's RANK and WORLD_SIZE. job and
    resume are OffloadOptimizer's: a job the servers trained under `job` is
    continued only with resume=True or rolled back by load_checkpoint.
    """
    refused = {"optimizer": optimizer, "training_data": training_data}
    for name, value in refused.items():
        if value is not None:
            raise NotImplementedError(
                f"zo.torch.initialize({name}=...): the optimizer runs on zo's servers from the "
                "config's 'optimizer' section, and data stays in your own loop; leave it out")
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
    if lr_scheduler is not None and "scheduler" in cfg:
        raise ValueError("zo.torch.initialize(lr_scheduler=...) with a scheduler section in the "
                         "config: the config's runs on the servers; give one of them")
    params = model.named_parameters() if model_parameters is None else model_parameters
    if checkpoint_dir is None and servers is None:
        # save_checkpoint moves each checkpoint from here into its save_dir.
        checkpoint_dir = tempfile.mkdtemp(prefix="zo-checkpoints-")
    opt = OffloadOptimizer(params, config, servers=servers, job=job, dp_rank=dp_rank,
                           dp_world_size=dp_world_size, checkpoint_dir=checkpoint_dir or "",
                           auth_token=auth_token, model=model, resume=resume)
    if lr_scheduler is not None and not hasattr(lr_scheduler, "step"):
        lr_scheduler = lr_scheduler(opt)  # DeepSpeed's callable form
    engine = OffloadEngine(model, opt, cfg, lr_scheduler)
    return engine, opt, None, engine.lr_scheduler

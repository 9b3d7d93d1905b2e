"""torch.optim's params argument as the job's named tensors: parameter groups
and the keys zo honours in them, the parameters zo can train, and a
group's learning rate as the servers take it."""

import math

import torch


# Keys of a torch.optim parameter group that zo honours, and those torch's
# Adam/AdamW carry whose only value zo can run is their default.
_GROUP_KEYS = {"params", "lr", "betas", "eps", "weight_decay", "initial_lr", "name"}


_GROUP_DEFAULT_ONLY = {"amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                       "differentiable": False, "fused": None, "decoupled_weight_decay": None}


def _group_settings(group):
    """A group's values that OffloadOptimizer holds against those the job
    opened with: betas, eps and weight_decay (a change goes to the servers
    with the step's rates, or is refused where they cannot take it), and
    the keys zo runs only at their default (absent: that default; a change
    is refused). Betas as a tuple of floats, however a scheduler wrote them."""
    fixed = {}
    for key in ("betas", "eps", "weight_decay", *_GROUP_DEFAULT_ONLY):
        value = group.get(key, _GROUP_DEFAULT_ONLY.get(key))
        if isinstance(value, (list, tuple)):
            value = tuple(float(v) for v in value)
        elif isinstance(value, torch.Tensor):
            value = value.tolist()
        fixed[key] = value
    return fixed


def _check_parameter(name, p):
    """Refuses a trainable parameter zo cannot train, naming it: the job's
    manifest is made of them, and pulled weights are written into their
    memory in place. Frozen parameters are not part of the job: any dtype."""
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"parameter '{name}' is a {type(p).__name__}, not a tensor")
    if not p.requires_grad:
        return
    if p.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"parameter '{name}' is {p.dtype}: zo trains float32, float16 "
                        "and bfloat16 parameters (freeze it with requires_grad=False to "
                        "keep it out of the job)")
    if p.layout != torch.strided:
        raise TypeError(f"parameter '{name}' is {p.layout}: zo trains dense parameters")
    if not p.is_contiguous():
        raise ValueError(f"parameter '{name}' is not contiguous (shape {list(p.shape)}, "
                         f"strides {list(p.stride())}): zo writes weights into a "
                         "parameter's memory in place; make it contiguous before "
                         "building the optimizer")


def _named_groups(params, model):
    """torch.optim's params argument (tensors, (name, tensor) pairs, or
    parameter groups: dicts with "params") as [(hyper-parameters,
    [(name, tensor)])]. Names make the job's manifest: pairs carry them;
    bare tensors take theirs from `model`'s named_parameters()."""
    if isinstance(params, torch.Tensor):
        raise TypeError("params must be an iterable of tensors, (name, tensor) pairs or "
                        "parameter groups, not a single tensor")
    items = list(params)
    if not items:
        raise ValueError("OffloadOptimizer got no parameters")
    if all(isinstance(x, dict) for x in items):
        groups = items
    elif any(isinstance(x, dict) for x in items):
        raise TypeError("params mixes parameter groups (dicts) with parameters: give one kind")
    else:
        groups = [{"params": items}]
    names = {}
    if model is not None:
        for n, p in model.named_parameters():
            names.setdefault(id(p), n)
    out = []
    seen = {}
    for g, group in enumerate(groups):
        if "params" not in group:
            raise ValueError(f"parameter group {g} has no 'params'")
        for key, value in group.items():
            if key in _GROUP_KEYS:
                continue
            if key in _GROUP_DEFAULT_ONLY:
                if value != _GROUP_DEFAULT_ONLY[key]:
                    raise NotImplementedError(
                        f"parameter group {g}: {key}={value!r} is not something zo's servers "
                        f"run (only {_GROUP_DEFAULT_ONLY[key]!r})")
                continue
            raise ValueError(f"parameter group {g}: unknown key '{key}' (zo honours lr, betas, "
                             "eps and weight_decay per group)")
        members = group["params"]
        members = [members] if isinstance(members, torch.Tensor) else list(members)
        named = []
        for x in members:
            if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str):
                name, p = x
            elif isinstance(x, torch.Tensor):
                if id(x) not in names:
                    raise TypeError(
                        "OffloadOptimizer takes model.named_parameters() (name, tensor) pairs, "
                        "or tensors together with model= to name them: the names make the "
                        "job's manifest")
                name, p = names[id(x)], x
            else:
                raise TypeError(f"parameter group {g} holds a {type(x).__name__}, not a "
                                "tensor or a (name, tensor) pair")
            _check_parameter(name, p)
            if id(p) in seen:
                raise ValueError(f"parameter '{name}' appears twice (groups {seen[id(p)]} and "
                                 f"{g}): each parameter belongs to one group")
            seen[id(p)] = g
            named.append((name, p))
        out.append(({k: v for k, v in group.items() if k != "params"}, named))
    all_names = [n for _, named in out for n, _ in named]
    if len(set(all_names)) != len(all_names):
        twice = sorted({n for n in all_names if all_names.count(n) > 1})[0]
        raise ValueError(f"parameter name '{twice}' appears twice: the job's manifest "
                         "needs one name per tensor")
    return out


def _lr_value(group, g):
    lr = group["lr"]
    value = float(lr.item() if isinstance(lr, torch.Tensor) else lr)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"param_groups[{g}]['lr'] is {lr}: must be finite and >= 0")
    return value

"""zo.torch's reading of a DeepSpeed-style config: the text and dict the job
is opened with, the job's dtype, and the optimizer section's values as
torch.optim's defaults."""

import json
import os

import torch


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


def _optimizer_defaults(cfg):
    """torch.optim's defaults from the config's optimizer section (DeepSpeed's
    defaults where it is silent)."""
    p = cfg.get("optimizer", {}).get("params", {})
    return {"lr": p.get("lr", 1e-3), "betas": tuple(p.get("betas", (0.9, 0.999))),
            "eps": p.get("eps", 1e-8), "weight_decay": p.get("weight_decay", 0.0)}

"""What the servers know a zo.torch run's job by: its name, the fingerprint of
the weights it starts from, and a tensor's memory as the bytes the client
reads and writes."""

import hashlib
import json
import os
import re
import secrets

import torch

from zo import _native


def _raw(t):
    """A writable buffer over a contiguous CPU tensor's memory (bf16 as int16)."""
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy()


def _owns_its_storage(t):
    """Whether `t` is the whole of its storage (not a view of a larger
    buffer that something else may read), so its memory may move."""
    storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return t.storage_offset() == 0 and storage.nbytes() == t.numel() * t.element_size()


def _default_job_name(dp_world_size):
    """A job name of this run's own: a fresh run never lands on another's job.
    dp ranks in separate processes must agree, so theirs comes from the
    launcher (torchrun's run id, or MASTER_ADDR and MASTER_PORT)."""
    if dp_world_size == 1:
        return f"zo-torch-{secrets.token_hex(6)}"
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run and run != "none":
        tag = run
    elif os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        tag = f"{os.environ['MASTER_ADDR']}-{os.environ['MASTER_PORT']}"
    else:
        raise ValueError(f"dp_world_size {dp_world_size} without job=: every rank must name the "
                         "same job, and without a launcher's TORCHELASTIC_RUN_ID or "
                         "MASTER_ADDR/MASTER_PORT zo cannot make a name they agree on")
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"zo-torch-{tag}")[:128]


def _fingerprint(manifest, params):
    """A hash of the manifest and the parameters' current values: what the job
    starts from (a rerun of the same script with the same seed gives the
    same; another model or seed, another). Never 0 (0 means none)."""
    h = hashlib.blake2b(json.dumps(manifest).encode(), digest_size=8)
    for p in params:
        t = p.detach()
        t = (t if t.device.type == "cpu" else t.cpu()).contiguous()
        h.update(_native.xxh3_64(_raw(t)).to_bytes(8, "little"))
    return int.from_bytes(h.digest(), "little") or 1

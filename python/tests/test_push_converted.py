"""Client.push_converted: an fp32 gradient for a 16-bit job, rounded by the
client straight into where its server reads it (the embedded server's
accumulator, a same-host zo-server's region) or, where no place is lent, into
a buffer of its own. Whatever the route, the job must take the bits torch's
own cast gives (round to nearest even): trained side by side with a job fed
torch-cast gradients through push, every version is the same bytes.
"""

import json
import os

import numpy as np
import pytest
import torch

from test_servers import ZO_SERVER, zo_servers
from zo import _native

N = 70000  # several of the update's tiles; not a multiple of a vector


def job_config(dtype, dpu):
    cfg = {"train_batch_size": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
           "zo": {"chunk_elems": 16384, "dpu": {"enabled": dpu, "warmup_steps": 0}}}
    cfg[dtype] = {"enabled": True}
    if dtype == "fp16":
        cfg["fp16"]["initial_scale_power"] = 0
    return cfg


def gradient(step):
    """fp32 values that round in every way: ties to even either side,
    subnormals of both dtypes, signed zeros, the largest bf16 and values
    fp16 can only just hold."""
    g = torch.Generator().manual_seed(step)
    values = torch.randn(N, generator=g) * 1e-3
    bits = values.view(torch.int32)
    bits[0::7] = (bits[0::7] & ~0xFFFF) | 0x8000  # halfway between two bf16
    bits[1::7] = (bits[1::7] & ~0x1FFF) | 0x1000  # halfway between two fp16
    values[2::97] = 1e-41  # an fp32 subnormal
    values[3::97] = -3e-8  # an fp16 subnormal
    values[4::97] = -0.0
    values[5::97] = 60000.0
    return values


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("dpu", [False, True], ids=["sync", "dpu"])
def test_an_embedded_job_takes_torchs_rounding(dtype, dpu):
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    server = _native.EmbeddedServer()
    clients = {name: _native.Client(json.dumps(job_config(dtype, dpu)), [("w", [N], dtype)],
                                    embedded=server, job=name)
               for name in ("converted", "cast")}
    init = (torch.arange(N, dtype=torch.float32) % 13 - 6) * 0.01
    for c in clients.values():
        c.init_params(0, init.numpy())
    weights = {name: [] for name in clients}
    for step in range(1, 7):
        g = gradient(step)
        values = g.numpy().copy()
        clients["converted"].push_converted(step, 0, values)
        values[:] = np.nan  # not read after push_converted returned
        cast = g.to(tdtype).view(torch.int16).numpy()
        clients["cast"].push(step, 0, cast)
        for name, c in clients.items():
            c.finish_step(step)
            w = np.empty(N, dtype=np.int16)
            c.pull_for_step(step + 1, [0], [w])
            weights[name].append(w)
    for step, (a, b) in enumerate(zip(weights["converted"], weights["cast"]), 1):
        assert np.array_equal(a, b), f"the weights step {step + 1} computes on differ"
    assert not np.array_equal(weights["cast"][0], weights["cast"][-1]), "the weights never moved"
    for c in clients.values():
        c.close()
    server.shutdown()


@pytest.mark.skipif(not os.path.exists(ZO_SERVER),
                    reason="ZO_SERVER_PATH names no zo-server binary (ctest sets it)")
def test_a_same_host_job_takes_torchs_rounding():
    with zo_servers(1) as (address,):
        clients = {name: _native.Client(json.dumps(job_config("bf16", False)),
                                        [("w", [N], "bf16")], servers=[address], job=name)
                   for name in ("converted", "cast")}
        init = np.full(N, 0.25, dtype=np.float32)
        for c in clients.values():
            c.init_params(0, init)
        for step in range(1, 5):
            g = gradient(step)
            clients["converted"].push_converted(step, 0, g.numpy())
            clients["cast"].push(step, 0, g.to(torch.bfloat16).view(torch.int16).numpy())
            pulled = []
            for c in clients.values():
                c.finish_step(step)
                w = np.empty(N, dtype=np.int16)
                c.pull_for_step(step + 1, [0], [w])
                pulled.append(w)
            assert np.array_equal(pulled[0], pulled[1]), f"version {step} differs"
        for c in clients.values():
            c.close()


def test_bad_values_are_refused_and_push_nothing():
    server = _native.EmbeddedServer()
    client = _native.Client(json.dumps(job_config("bf16", False)), [("w", [N], "bf16")],
                            embedded=server)
    client.init_params(0, np.zeros(N, dtype=np.float32))
    with pytest.raises(ValueError, match="float32"):
        client.push_converted(1, 0, np.zeros(N, dtype=np.float64))
    with pytest.raises(RuntimeError, match=f"has {N - 1} elements; it has {N}"):
        client.push_converted(1, 0, np.zeros(N - 1, dtype=np.float32))
    with pytest.raises(IndexError, match="tensor index 1"):
        client.push_converted(1, 1, np.zeros(N, dtype=np.float32))
    # Nothing of step 1 went in: a whole push of it is taken as the first.
    client.push_converted(1, 0, np.full(N, 0.5, dtype=np.float32))
    client.finish_step(1)
    w = np.empty(N, dtype=np.int16)
    changed, _ = client.pull_for_step(2, [0], [w])
    assert changed and client.job_status()["version"] == 1
    client.close()
    server.shutdown()

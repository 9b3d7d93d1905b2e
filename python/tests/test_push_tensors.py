"""Client.push_tensors: a step's gradients of many tensors in one call, as
zo.torch's step() sends them. Tensors of the job's dtype are sent from their
own memory; float32 ones of a 16-bit job are rounded into where their servers
read them. Either way the job must take what one push (or push_converted)
per tensor gives: trained side by side, every version is the same bytes. A
bad gradient anywhere in the batch is refused, naming it, before any is
pushed. zo.torch's step() sends each gradient the cheapest way its form
allows (a batch of the job's dtype, a batch to round, the rest one by one):
a model with every form trains as a client fed one cast push per tensor.
"""

import json
import os
import sys

import numpy as np
import pytest
import torch

import zo.torch
from test_servers import ZO_SERVER, zo_servers
from zo import _native

SHAPES = [[300, 70], [5], [40000], [1]]  # the third spans chunks
TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def job_config(dtype, dpu=False):
    cfg = {"train_batch_size": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
           "zo": {"chunk_elems": 16384, "dpu": {"enabled": dpu, "warmup_steps": 0}}}
    if dtype != "fp32":
        cfg[dtype] = {"enabled": True, "initial_scale_power": 0} if dtype == "fp16" else {
            "enabled": True}
    return cfg


def manifest(dtype, shapes=SHAPES):
    return [(f"t{i}", shape, dtype) for i, shape in enumerate(shapes)]


def gradients(step, shapes=SHAPES):
    g = torch.Generator().manual_seed(step)
    return [torch.randn(shape, generator=g) * 1e-3 for shape in shapes]


def raw(t):
    return (t.view(torch.int16) if t.element_size() == 2 else t).numpy()


def open_pair(dtype, dpu, shapes=SHAPES, **where):
    clients = {name: _native.Client(json.dumps(job_config(dtype, dpu)), manifest(dtype, shapes),
                                    job=name, **where)
               for name in ("batch", "one_by_one")}
    g = torch.Generator().manual_seed(0)
    init = [torch.randn(shape, generator=g) * 0.1 for shape in shapes]
    for c in clients.values():
        for i, values in enumerate(init):
            c.init_params(i, values.numpy())
    return clients


def train_side_by_side(clients, dtype, convert, steps, shapes=SHAPES):
    """Steps both jobs; returns each version's weights of both, as bytes."""
    tdtype = TORCH[dtype]
    versions = []
    everything = list(range(len(shapes)))
    for step in range(1, steps + 1):
        grads = gradients(step, shapes)
        batch = [g.clone() if convert else g.to(tdtype) for g in grads]
        clients["batch"].push_tensors(step, everything, batch, convert)
        if convert:
            for t in batch:
                t.fill_(float("nan"))  # not read once push_tensors returned
        for i, g in enumerate(grads):
            clients["one_by_one"].push(step, i, raw(g.to(tdtype)))
        pulled = {}
        for name, c in clients.items():
            c.finish_step(step)
            pulled[name] = [torch.empty(shape, dtype=tdtype) for shape in shapes]
            c.pull_for_step(step + 1, everything, [raw(w) for w in pulled[name]])
        versions.append(pulled)
    return versions


def assert_same_versions(versions):
    for step, pulled in enumerate(versions, 1):
        for i, (a, b) in enumerate(zip(pulled["batch"], pulled["one_by_one"])):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), \
                f"tensor {i} of version {step} differs"
    first, last = versions[0]["one_by_one"][0], versions[-1]["one_by_one"][0]
    assert not torch.equal(first, last), "the weights never moved"


def test_a_batch_larger_than_a_rounding_batch_is_rounded_as_torch_rounds():
    """push_tensors rounds float32 values on every core, about 4 Mi elements
    at a time, each batch pushed once rounded: tensors that end batches and
    pieces mid-way must still arrive as torch's .to() rounds them."""
    shapes = [[3, 1 << 20], [70001], [(1 << 21) + 3], [5]]
    server = _native.EmbeddedServer()
    clients = open_pair("bf16", False, shapes, embedded=server)
    assert_same_versions(train_side_by_side(clients, "bf16", True, steps=2, shapes=shapes))
    for c in clients.values():
        c.close()
    server.shutdown()


@pytest.mark.parametrize("dtype,convert", [("fp32", False), ("bf16", False), ("bf16", True),
                                           ("fp16", True)])
@pytest.mark.parametrize("dpu", [False, True], ids=["sync", "dpu"])
def test_an_embedded_job_takes_a_batch_as_one_push_per_tensor(dtype, convert, dpu):
    server = _native.EmbeddedServer()
    clients = open_pair(dtype, dpu, embedded=server)
    assert_same_versions(train_side_by_side(clients, dtype, convert, steps=5))
    for c in clients.values():
        c.close()
    server.shutdown()


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_lent_gradients_are_read_in_place_until_the_version_is_pulled(dtype):
    """push_tensors(lend=True) on an embedded server: a gradient of the job's
    dtype is kept (a reference held) while its chunk waits for the rest of
    the step, is let go once the step's version is pulled, and the job
    trains as with copies. Tensors of 64 Ki-element blocks and more, in
    chunks that start on a block: most blocks lie at odd offsets into their
    tensor, so the update reads them unaligned."""
    shapes = [[70001], [200000], [3]]
    cfg = {"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zo": {"chunk_elems": 131072}}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    server = _native.EmbeddedServer()
    clients = {name: _native.Client(json.dumps(cfg), [(f"t{i}", s, dtype)
                                                      for i, s in enumerate(shapes)],
                                    job=name, embedded=server)
               for name in ("copied", "lent")}
    for c in clients.values():
        for i, shape in enumerate(shapes):
            c.init_params(i, np.full(shape, 0.25, dtype=np.float32))
    g = torch.Generator().manual_seed(3)
    previous = None
    for step in range(1, 4):
        grads = [(torch.randn(s, generator=g) * 1e-3).to(TORCH[dtype]) for s in shapes]
        refs = sys.getrefcount(grads[0])
        for name, c in clients.items():
            lend = name == "lent"
            c.push_tensors(step, [0], [grads[0]], lend=lend)
            # A call that lets go of the references the pushes are done with.
            c.push_tensors(step, [2], [grads[2]], lend=lend)
            # Counted outside the asserts, whose rewriting holds references.
            now = sys.getrefcount(grads[0])
            assert now == refs + lend, \
                "t0 is read in place while its chunk waits for t1" if lend else "t0 was copied"
            if lend and previous is not None:  # each client lets go of its own
                before = sys.getrefcount(previous)
                assert before == 2, "last step's t0 is let go"
            c.push_tensors(step, [1], [grads[1]], lend=lend)
            c.finish_step(step)
        pulled = {}
        for name, c in clients.items():
            pulled[name] = [torch.empty(s, dtype=TORCH[dtype]) for s in shapes]
            c.pull_for_step(step + 1, [0, 1, 2], [raw(w) for w in pulled[name]])
        for i in range(3):
            assert torch.equal(pulled["lent"][i].view(torch.uint8),
                               pulled["copied"][i].view(torch.uint8)), \
                f"tensor {i} of version {step} differs"
        previous = grads[0]
        del grads
    for c in clients.values():
        c.close()
    server.shutdown()


@pytest.mark.skipif(not os.path.exists(ZO_SERVER),
                    reason="ZO_SERVER_PATH names no zo-server binary (ctest sets it)")
@pytest.mark.parametrize("convert", [False, True], ids=["bf16", "fp32_rounded"])
def test_a_same_host_job_takes_a_batch_as_one_push_per_tensor(convert):
    with zo_servers(1) as (address,):
        clients = open_pair("bf16", False, servers=[address])
        assert_same_versions(train_side_by_side(clients, "bf16", convert, steps=4))
        for c in clients.values():
            c.close()


def test_a_bad_gradient_anywhere_is_named_and_nothing_is_pushed():
    server = _native.EmbeddedServer()
    client = _native.Client(json.dumps(job_config("bf16")), manifest("bf16"), embedded=server)
    for i, shape in enumerate(SHAPES):
        client.init_params(i, np.zeros(shape, dtype=np.float32))
    good = [torch.full(shape, 0.5) for shape in SHAPES]
    everything = list(range(len(SHAPES)))

    def with_last(bad):
        return good[:-1] + [bad]

    with pytest.raises(ValueError, match="4 tensor indices for 3 gradients"):
        client.push_tensors(1, everything, good[:3], True)
    with pytest.raises(IndexError, match="tensor index 4"):
        client.push_tensors(1, [0, 1, 2, 4], good, True)
    with pytest.raises(ValueError, match=r"tensor 3 \('t3'\) has 2 elements; it has 1"):
        client.push_tensors(1, everything, with_last(torch.zeros(2)), True)
    with pytest.raises(ValueError, match=r"tensor 3 \('t3'\) has 2-byte elements"):
        client.push_tensors(1, everything, with_last(torch.zeros(1, dtype=torch.bfloat16)), True)
    with pytest.raises(ValueError, match=r"tensor 0 \('t0'\) has 4-byte elements.*bf16"):
        client.push_tensors(1, everything, good, False)
    with pytest.raises(ValueError, match=r"tensor 0 \('t0'\) is not a contiguous CPU tensor"):
        client.push_tensors(1, [0], [torch.zeros(70, 300).t()], True)
    with pytest.raises(TypeError, match=r"tensor 3 \('t3'\) is a numpy.ndarray"):
        client.push_tensors(1, everything, with_last(np.zeros(1, dtype=np.float32)), True)
    # Nothing of step 1 went in: the whole batch is then taken as its first push.
    client.push_tensors(1, everything, good, True)
    client.finish_step(1)
    # Every tensor: a pull of some returns once they are written, which
    # may be before the version is the job's.
    changed, _ = client.pull_for_step(
        2, everything, [np.empty(shape, dtype=np.int16) for shape in SHAPES]
    )
    assert changed and client.job_status()["version"] == 1
    client.close()
    server.shutdown()


def test_an_fp32_job_takes_no_conversion():
    server = _native.EmbeddedServer()
    client = _native.Client(json.dumps(job_config("fp32")), manifest("fp32"), embedded=server)
    with pytest.raises(ValueError, match="float32 values \\(convert=True\\) for a 16-bit job"):
        client.push_tensors(1, [1], [torch.zeros(5)], True)
    client.close()
    server.shutdown()


def test_a_step_with_gradients_of_every_form_takes_one_cast_push_each():
    shapes = {"fp32": [300, 70], "bf16": [40000], "fp16": [33], "strided": [8, 8], "none": [5]}
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    torch.manual_seed(0)
    params = {name: torch.nn.Parameter((torch.randn(shape) * 0.1).to(dtypes.get(name,
                                                                                 torch.float32)))
              for name, shape in shapes.items()}
    cfg = job_config("bf16")
    server = _native.EmbeddedServer()
    reference = _native.Client(json.dumps(cfg), [(n, s, "bf16") for n, s in shapes.items()],
                               embedded=server, job="reference")
    for i, p in enumerate(params.values()):
        reference.init_params(i, p.detach().float().numpy())
    opt = zo.torch.OffloadOptimizer(list(params.items()), cfg, job="zo-torch-forms")
    with pytest.warns(UserWarning, match="parameter 'none' has no gradient"):
        for step in range(1, 5):
            g = torch.Generator().manual_seed(step)
            for name, p in params.items():
                grad = torch.randn(shapes[name], generator=g) * 1e-3
                p.grad = {"fp32": grad, "strided": grad.t().contiguous().t(),
                          "none": None}.get(name, grad.to(p.dtype))
            assert not params["strided"].grad.is_contiguous()
            for i, p in enumerate(params.values()):
                grad = torch.zeros(p.shape) if p.grad is None else p.grad
                reference.push(step, i, raw(grad.to(torch.bfloat16).contiguous()))
            opt.step()
            reference.finish_step(step)
            pulled = [torch.empty(shape, dtype=torch.bfloat16) for shape in shapes.values()]
            reference.pull_for_step(step + 1, list(range(len(shapes))), [raw(w) for w in pulled])
            for (name, p), w in zip(params.items(), pulled):
                assert torch.equal(p.detach(), w.to(p.dtype)), f"{name} after step {step}"
    reference.close()
    server.shutdown()
    opt.close()

"""zo.torch.OffloadOptimizer against torch.optim.AdamW fed the same gradients.

Tolerances: both sides keep fp32 weights and moments and differ only in the
order of fp32 operations inside one Adam update (a few ulps of the update,
whose size is about lr), plus one rounding of the weight per step. Over 20
steps of lr 1e-2 that stays below 20 x (4 ulps of |w| + 4 ulps of 1e-2):
rtol 2e-5, atol 1e-6 leave a margin of about 2.
"""

import copy

import pytest
import torch

import zo.torch

STEPS = 20
LR = 1e-2


class TiedLm(torch.nn.Module):
    """Embedding, Linear, LayerNorm, and a head tied to the embedding."""

    def __init__(self, vocab=16, dim=8):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.mix = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, tokens):
        h = self.norm(torch.tanh(self.mix(self.embed(tokens[:, :-1]))))
        logits = h @ self.embed.weight.t()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 tokens[:, 1:].reshape(-1))


def config(dpu=False):
    return {"train_batch_size": 1,
            "optimizer": {"type": "AdamW",
                          "params": {"lr": LR, "betas": [0.9, 0.999], "eps": 1e-8,
                                     "weight_decay": 0.01}},
            "zo": {"dpu": {"enabled": dpu, "warmup_steps": 0}}}


def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randint(0, 16, (4, 9), generator=g)


def reference_and_model():
    torch.manual_seed(0)
    model = TiedLm()
    return model, copy.deepcopy(model)


def assert_same_weights(model, ref, what):
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=2e-5, atol=1e-6,
                                   msg=lambda m: f"{what}, {name}: {m}")


def step_both(model, ref, opt, ref_opt, step):
    """One step of zo's optimizer on the model's gradients, and of the
    reference fed the same gradients; returns the loss."""
    loss = model(batch(step))
    loss.backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        q.grad = p.grad.clone()
    opt.step()
    ref_opt.step()
    opt.zero_grad()
    ref_opt.zero_grad()
    return loss.item()


def test_tied_parameters_form_one_tensor_of_the_manifest():
    model, _ = reference_and_model()
    opt = zo.torch.OffloadOptimizer(model.named_parameters(), config=config())
    assert [n for n, _ in model.named_parameters()] == opt._names
    assert "embed.weight" in opt._names and len(opt._names) == 5
    opt.close()


def test_trains_like_adamw_fed_the_same_gradients():
    model, ref = reference_and_model()
    opt = zo.torch.OffloadOptimizer(model.named_parameters(), config=config())
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.01)
    losses = []
    for step in range(1, STEPS + 1):
        losses.append(step_both(model, ref, opt, ref_opt, step))
        assert_same_weights(model, ref, f"step {step}")
    assert opt.global_steps == STEPS
    assert opt.param_groups[0]["lr"] == pytest.approx(LR)
    assert losses[-1] < losses[0]
    opt.close()


def test_a_parameter_given_new_memory_gets_the_next_weights_there():
    model, ref = reference_and_model()
    opt = zo.torch.OffloadOptimizer(model.named_parameters(), config=config())
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.01)
    step_both(model, ref, opt, ref_opt, 1)
    model.mix.weight.data = model.mix.weight.data.clone()  # what some scripts do
    for step in (2, 3):
        step_both(model, ref, opt, ref_opt, step)
        assert_same_weights(model, ref, f"step {step}, the weight in new memory")
    opt.close()


class FailingPull:
    """The client, but its pull fails: a step that raises after its pushes
    went out, which the real servers cannot be made to do on demand."""

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name):
        return getattr(self._client, name)

    def pull_for_step(self, *args):
        raise RuntimeError("UNAVAILABLE: the injected pull failure")


def test_a_step_that_fails_after_lending_gives_the_loop_fresh_gradients():
    """step() lends its gradients to the servers, which may read them until
    their update ends. When step() raises after the pushes, each lent .grad
    is replaced by a copy, so what the loop writes into .grad next cannot
    reach what the servers read."""
    w = torch.nn.Parameter(torch.zeros(200000, dtype=torch.bfloat16))
    cfg = dict(config(), bf16={"enabled": True})
    opt = zo.torch.OffloadOptimizer([("w", w)], config=cfg)
    w.grad = torch.randn(200000, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    lent = w.grad
    before = lent.clone()
    client = opt._client
    opt._client = FailingPull(client)
    with pytest.raises(RuntimeError, match="injected"):
        opt.step()
    assert w.grad is not lent, "the failed step left the lent tensor in .grad"
    assert torch.equal(w.grad, before)
    w.grad.zero_()  # what zero_grad(set_to_none=False) does
    assert torch.equal(lent, before), "the loop's write reached the lent gradient"
    opt._client = client
    opt.close()


def test_with_dpu_each_step_computes_on_weights_one_step_older():
    model, ref = reference_and_model()
    opt = zo.torch.OffloadOptimizer(model.named_parameters(), config=config(dpu=True))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.01)
    snapshots = [copy.deepcopy(ref)]  # the reference after 0, 1, ... steps
    for step in range(1, 8):
        # Step 1 computes on v0; step s > 1 on v(s-2).
        assert_same_weights(model, snapshots[max(step - 2, 0)], f"weights of step {step}")
        step_both(model, ref, opt, ref_opt, step)
        snapshots.append(copy.deepcopy(ref))
    opt.close()


def test_a_bad_config_is_named():
    model, _ = reference_and_model()
    with pytest.raises(RuntimeError, match="lr"):
        zo.torch.OffloadOptimizer(model.named_parameters(),
                                  config={"train_batch_size": 1,
                                          "optimizer": {"type": "AdamW",
                                                        "params": {"lr": -1}}})


def test_an_inf_gradient_skips_the_step_everywhere_and_halves_the_scale():
    # fp32 parameters and an fp16 job: pushes and pulls go through staging.
    model, _ = reference_and_model()
    cfg = config()
    cfg["fp16"] = {"enabled": True, "initial_scale_power": 8, "hysteresis": 1}
    opt = zo.torch.OffloadOptimizer(model.named_parameters(), config=cfg)
    assert opt.loss_scale == 256
    (model(batch(1)) * opt.loss_scale).backward()
    opt.step()
    opt.zero_grad()
    before = [p.detach().clone() for p in model.parameters()]
    (model(batch(2)) * opt.loss_scale).backward()
    model.mix.weight.grad[0, 0] = float("inf")
    opt.step()
    for (name, p), b in zip(model.named_parameters(), before):
        assert torch.equal(p.detach(), b), name
    assert opt.loss_scale == 128
    assert opt._client.job_status()["last_skipped"]
    opt.close()


def test_a_push_sends_from_the_tensor_itself_until_finish_step():
    """No copy: the client holds the gradient's buffer until its bytes are
    written, and finish_step lets go of it (references are dropped under the
    GIL, never on gRPC's threads)."""
    import json
    import sys

    import numpy as np

    from zo import _native

    server = _native.EmbeddedServer()
    client = _native.Client(json.dumps(config()), [("w", [1 << 16], "fp32")], embedded=server)
    client.init_params(0, np.zeros(1 << 16, dtype=np.float32))
    grad = np.full(1 << 16, 0.5, dtype=np.float32)
    before = sys.getrefcount(grad)
    client.push(1, 0, grad)
    # Held by the client (or, written already, by the queue of references
    # the next call drops).
    assert sys.getrefcount(grad) == before + 1
    client.finish_step(1)
    weights = np.empty(1 << 16, dtype=np.float32)
    changed, _ = client.pull_for_step(2, [0], [weights])
    assert changed and np.all(weights == weights[0]) and weights[0] < 0  # the step used 0.5
    client.close()
    server.shutdown()  # the in-process server read the same bytes: now nobody holds them
    assert sys.getrefcount(grad) == before

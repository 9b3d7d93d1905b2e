"""zo.torch.initialize: a DeepSpeed training loop over zo's servers."""

import os

import pytest
import torch

import zo.torch
from test_offload_optimizer import LR, assert_same_weights, batch, reference_and_model


def ds_config(gas):
    return {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas,
            "optimizer": {"type": "AdamW",
                          "params": {"lr": LR, "betas": [0.9, 0.999], "eps": 1e-8,
                                     "weight_decay": 0.01}}}


def test_micro_batches_accumulate_and_the_servers_step_at_the_boundary():
    model, ref = reference_and_model()
    engine, opt, _, scheduler = zo.torch.initialize(model=model, config=ds_config(2))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.01)
    assert engine.train_micro_batch_size_per_gpu() == 4
    assert engine.gradient_accumulation_steps() == 2
    for step in range(1, 6):
        for m in range(2):
            engine.backward(engine(batch(10 * step + m)))
            assert engine.is_gradient_accumulation_boundary() == (m == 1)
            # The last micro-batch's gradients left during its backward.
            assert len(opt._pushed) == (len(opt._names) if m == 1 else 0)
            if m == 1:  # the mean of the two micro-batches' gradients
                for p, q in zip(model.parameters(), ref.parameters()):
                    q.grad = p.grad.clone()
            engine.step()
        ref_opt.step()
        ref_opt.zero_grad()
        assert engine.global_steps == step
        assert_same_weights(model, ref, f"step {step}")
        assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    assert scheduler.get_last_lr() == [pytest.approx(LR)]
    assert engine.get_lr() == [pytest.approx(LR)]
    opt.close()


def train(engine, steps):
    for _ in range(steps):
        engine.backward(engine(batch(engine.global_steps + 1)))
        engine.step()


def test_save_and_load_checkpoint_resume_the_same_trajectory(tmp_path):
    model, _ = reference_and_model()
    engine, opt, _, _ = zo.torch.initialize(model=model, config=ds_config(1))
    train(engine, 3)
    assert engine.save_checkpoint(str(tmp_path), client_state={"epoch": 7})
    assert (tmp_path / "latest").read_text() == "global_step3"
    assert os.path.exists(tmp_path / "global_step3" / "zo_engine.json")
    train(engine, 3)
    after = [p.detach().clone() for p in model.parameters()]
    path, client_state = engine.load_checkpoint(str(tmp_path))
    assert path.endswith("global_step3") and client_state == {"epoch": 7}
    assert engine.global_steps == 3
    train(engine, 3)
    for (name, p), a in zip(model.named_parameters(), after):
        assert torch.equal(p.detach(), a), name
    assert engine.load_checkpoint(str(tmp_path / "nothing-here")) == (None, None)
    opt.close()


def test_a_gradient_changed_between_backward_and_step_is_refused_naming_it():
    # backward pushed the gradients as it made them: a clip (or any change)
    # after it would not reach the servers, so step() refuses it. Reading
    # them is fine.
    model, _ = reference_and_model()
    engine, opt, _, _ = zo.torch.initialize(model=model, config=ds_config(1))
    engine.backward(engine(batch(1)))
    norm = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    engine.step()
    assert engine.global_steps == 1 and norm > 0
    engine.backward(engine(batch(2)))
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-6)
    with pytest.raises(RuntimeError, match=r"parameter '[a-z_.]+': its \.grad changed between "
                                           r"engine\.backward\(\) and engine\.step\(\)"):
        engine.step()
    assert engine.global_steps == 1
    opt.close()

    model, _ = reference_and_model()
    engine, opt, _, _ = zo.torch.initialize(model=model, config=ds_config(2))
    engine.backward(engine(batch(1)))
    for p in model.parameters():  # between micro-batches: summed in .grad, as torch does
        p.grad.mul_(0.5)
    engine.step()
    engine.backward(engine(batch(2)))
    first = next(model.parameters())
    first.grad = first.grad.clone()  # another tensor counts as a change too
    with pytest.raises(RuntimeError, match="its .grad changed"):
        engine.step()
    opt.close()


def test_what_the_engine_does_not_offer_is_named():
    model, _ = reference_and_model()
    with pytest.raises(NotImplementedError, match="optimizer"):
        zo.torch.initialize(model=model, config=ds_config(1),
                            optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="config"):
        zo.torch.initialize(model=model)
    per_micro_batch = dict(ds_config(2), zo={"gradient_accumulation": "servers"})
    with pytest.raises(NotImplementedError, match="gradient_accumulation"):
        zo.torch.initialize(model=model, config=per_micro_batch)
    streamed = dict(ds_config(1), zero_optimization={"offload_param": {"device": "cpu"}})
    with pytest.raises(NotImplementedError, match="offload_param.device"):
        zo.torch.initialize(model=model, config=streamed)
    engine, opt, _, _ = zo.torch.initialize(model=model, config=ds_config(1))
    with pytest.raises(AttributeError, match="pipeline_parallelism"):
        engine.pipeline_parallelism()
    opt.close()


def test_get_lr_after_load_checkpoint_is_the_checkpoints(tmp_path):
    model, _ = reference_and_model()
    cfg = dict(ds_config(1), scheduler={"type": "WarmupLR", "params": {
        "warmup_min_lr": 0, "warmup_max_lr": LR, "warmup_num_steps": 10,
        "warmup_type": "linear"}})
    engine, opt, _, scheduler = zo.torch.initialize(model=model, config=cfg)
    train(engine, 3)
    saved_lr = engine.get_lr()
    engine.save_checkpoint(str(tmp_path))
    train(engine, 3)
    assert engine.get_lr() != saved_lr  # still warming up
    engine.load_checkpoint(str(tmp_path))
    assert engine.get_lr() == saved_lr and scheduler.get_last_lr() == saved_lr
    opt.close()


def test_the_dp_rank_comes_from_the_launchers_environment(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    model, _ = reference_and_model()
    with pytest.raises(ValueError, match="dp_world_size 2 without job="):
        zo.torch.initialize(model=model, config=ds_config(3))
    # Every rank of one launch names the same job.
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("MASTER_PORT", "29500")
    engine, opt, _, _ = zo.torch.initialize(model=model, config=ds_config(3))
    assert opt.job == "zo-torch-10.1.2.3-29500"
    assert (engine.global_rank, engine.world_size, engine.local_rank) == (1, 2, 1)
    assert engine.train_batch_size() == 4 * 3 * 2
    assert not engine.fp16_enabled() and engine.zero_optimization_stage() == 0
    opt.close()

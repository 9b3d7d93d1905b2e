"""zo.hf.ZoTrainer against transformers.Trainer's own AdamW ("adamw_torch").

Both train the same GPT2LMHeadModel (built from its config, no download)
from the same weights on the same batches, with the Trainer's linear
warmup and decay, weight decay 0.1 on the decay group and the default
max_grad_norm. Unlike test_offload_optimizer.py, each run computes its own
gradients, so the weights' few-ulp differences (that file's argument for
rtol 2e-5, atol 1e-6) also pass through the next forward and backward;
over 12 steps of lr <= 5e-3 the measured gaps stay far below those bounds
(losses within 5e-7, weights within 1.2e-7).

One slice is left out of that bound: the key part of each attention
layer's c_attn.bias. Adding a vector to every key adds the same number to
all of a query's logits, which softmax ignores, so its gradient is zero
but for rounding: noise of about 1e-9, which Adam (eps 1e-8) turns into
updates of up to a tenth of the rate, different in any two runs that round
differently (measured: 1.5e-5 apart). It is held to 1e-4.
"""

import copy
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

import zo.hf  # noqa: E402

STEPS = 12
LR = 5e-3
WEIGHT_DECAY = 0.1


class Tokens(torch.utils.data.Dataset):
    """Synthetic token sequences, fixed by their index."""

    def __init__(self, count=STEPS * 4, length=32, vocab=128):
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, vocab, (count, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_gpt2():
    config = transformers.GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2,
                                     n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def training_args(tmp_path, **overrides):
    kwargs = dict(output_dir=str(tmp_path), max_steps=STEPS, per_device_train_batch_size=4,
                  learning_rate=LR, lr_scheduler_type="linear", warmup_steps=3,
                  weight_decay=WEIGHT_DECAY, logging_steps=1, save_strategy="no",
                  report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
                  dataloader_num_workers=0, optim="adamw_torch")
    kwargs.update(overrides)
    return transformers.TrainingArguments(**kwargs)


def losses(trainer):
    return [(e["loss"], e["grad_norm"], e["learning_rate"]) for e in trainer.state.log_history
            if "loss" in e]


def test_zo_trainer_trains_as_the_trainers_adamw(tmp_path):
    model = tiny_gpt2()
    ref_model = copy.deepcopy(model)
    data = Tokens()

    ref = transformers.Trainer(model=ref_model, args=training_args(tmp_path / "torch"),
                               train_dataset=data)
    ref.train()
    trainer = zo.hf.ZoTrainer(model=model, args=training_args(tmp_path / "zo"),
                              train_dataset=data)
    trainer.train()

    opt = trainer.zo_optimizer
    assert isinstance(opt, zo.torch.OffloadOptimizer) and opt.global_steps == STEPS
    got, want = losses(trainer), losses(ref)
    assert len(got) == len(want) == STEPS
    for step, ((loss, norm, lr), (ref_loss, ref_norm, ref_lr)) in enumerate(zip(got, want), 1):
        assert lr == ref_lr, f"step {step}"
        assert loss == pytest.approx(ref_loss, rel=2e-5, abs=1e-6), f"step {step}"
        assert norm == pytest.approx(ref_norm, rel=2e-5, abs=1e-6), f"step {step}"
    gaps = []
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        p, q = p.detach().clone(), q.detach().clone()
        if name.endswith("attn.c_attn.bias"):  # [query | key | value], the key's ignored
            dim = model.config.n_embd
            torch.testing.assert_close(p[dim:2 * dim], q[dim:2 * dim], rtol=0, atol=1e-4,
                                       msg=lambda m: f"{name}, key part: {m}")
            p[dim:2 * dim] = q[dim:2 * dim]
        torch.testing.assert_close(p, q, rtol=2e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
        gaps.append((p - q).abs().max().item())
    print(f"worst loss gap {max(abs(a[0] - b[0]) for a, b in zip(got, want)):.3g}, "
          f"worst weight gap {max(gaps):.3g}")

    # The Trainer's groups reached the servers: biases and LayerNorm weights
    # were not decayed. Decayed, a LayerNorm weight (about 1) would have moved
    # by sum(lr) * 0.1, far past the tolerance the weights matched within.
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == WEIGHT_DECAY and no_decay["weight_decay"] == 0.0
    no_decay_names = {n for n, p in model.named_parameters()
                      if any(p is q for q in no_decay["params"])}
    assert "transformer.ln_f.weight" in no_decay_names
    assert all(n.endswith("bias") or ".ln_" in n for n in no_decay_names)
    assert "transformer.wte.weight" not in no_decay_names
    would_decay = sum(lr for _, _, lr in want) * WEIGHT_DECAY * 0.9
    assert would_decay > 1000 * 1e-6
    assert math.isclose(model.transformer.ln_f.weight.detach().mean().item(),
                        ref_model.transformer.ln_f.weight.detach().mean().item(), abs_tol=1e-6)
    opt.close()


def test_save_steps_keep_the_servers_checkpoint_and_resume(tmp_path):
    model = tiny_gpt2()
    data = Tokens()
    args = training_args(tmp_path / "run", save_strategy="steps", save_steps=6, logging_steps=1)
    trainer = zo.hf.ZoTrainer(model=model, args=args, train_dataset=data)
    trainer.train()
    finished = [p.detach().clone() for p in model.parameters()]
    checkpoint = tmp_path / "run" / "checkpoint-6"
    state = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    assert state["zo"]["checkpoint"] == str(checkpoint / zo.hf.CHECKPOINT_SUBDIR)
    assert (checkpoint / zo.hf.CHECKPOINT_SUBDIR).is_dir()
    trainer.zo_optimizer.close()

    # A new process's worth: another model, another trainer, resumed from step 6.
    resumed_model = tiny_gpt2()
    resumed = zo.hf.ZoTrainer(model=resumed_model, args=args, train_dataset=data)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.zo_optimizer.global_steps == STEPS
    for (name, p), q in zip(resumed_model.named_parameters(), finished):
        torch.testing.assert_close(p.detach(), q, rtol=2e-5, atol=1e-6,
                                   msg=lambda m: f"{name}: {m}")
    resumed.zo_optimizer.close()


def test_what_zo_cannot_honour_is_refused(tmp_path):
    model = tiny_gpt2()
    with pytest.raises(ValueError, match="optim='adafactor'"):
        zo.hf.ZoTrainer(model=model, args=training_args(tmp_path, optim="adafactor"),
                        train_dataset=Tokens())
    with pytest.raises(ValueError, match="scheduler"):
        zo.hf.ZoTrainer(model=model, args=training_args(tmp_path), train_dataset=Tokens(),
                        zo_config={"scheduler": {"type": "WarmupLR"}})
    with pytest.raises(ValueError, match="optimizers="):
        zo.hf.ZoTrainer(model=model, args=training_args(tmp_path), train_dataset=Tokens(),
                        optimizers=(torch.optim.AdamW(model.parameters()), None))

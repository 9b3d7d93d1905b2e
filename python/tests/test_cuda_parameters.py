"""zo.torch with parameters on a CUDA device. Gradients leave through
page-locked buffers copied on a side stream (no synchronize per parameter)
and are pushed once their copies have arrived; weights come back through
page-locked staging on the compute stream. The weights must be
torch.optim.AdamW's on the CPU fed the same gradients. Runs where torch sees
a GPU (deploy/gpu-check.sh, part pytest); skipped elsewhere."""

import pytest
import torch

import zo.torch
from test_offload_optimizer import LR, TiedLm, batch, config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="torch sees no CUDA device")
STEPS = 4


def cuda_model_and_cpu_reference(dtype=torch.float32):
    torch.manual_seed(0)
    # 2048 wide: 16 MB copies take long enough that one racing the
    # backward, the pull or zero_grad would show.
    ref = TiedLm(dim=2048)
    model = TiedLm(dim=2048).to("cuda", dtype)
    model.load_state_dict(ref.state_dict())
    # Both start from the model's own (for bf16: rounded) weights.
    ref.load_state_dict({k: v.float().cpu() for k, v in model.state_dict().items()})
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.01)
    return model, ref, ref_opt


def feed_same_gradients(model, ref):
    for p, q in zip(model.parameters(), ref.parameters()):
        q.grad = p.grad.detach().float().cpu()


def assert_same_weights(model, ref, what, rtol=2e-5, atol=1e-6):
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().float().cpu(), q.detach().to(p.dtype).float(),
                                   rtol=rtol, atol=atol, msg=lambda m: f"{what}, {name}: {m}")


def test_the_engine_pushes_cuda_gradients_from_the_backward():
    model, ref, ref_opt = cuda_model_and_cpu_reference()
    config_ = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
               "optimizer": config()["optimizer"]}
    engine, opt, _, _ = zo.torch.initialize(model=model, config=config_)
    for step in range(1, STEPS + 1):
        for m in range(2):
            engine.backward(engine(batch(10 * step + m).cuda()))
            if m == 1:
                feed_same_gradients(model, ref)
            engine.step()
        ref_opt.step()
        ref_opt.zero_grad()
        assert engine.global_steps == step
        assert_same_weights(model, ref, f"step {step}")
        assert all(not p.grad.any() for p in model.parameters())
    opt.close()


def test_a_loop_that_pushes_in_step_trains_the_same():
    model, ref, ref_opt = cuda_model_and_cpu_reference()
    opt = zo.torch.OffloadOptimizer(model.named_parameters(), config=config())
    for step in range(1, STEPS + 1):
        model(batch(step).cuda()).backward()
        feed_same_gradients(model, ref)
        opt.step()
        opt.zero_grad()
        ref_opt.step()
        ref_opt.zero_grad()
        assert_same_weights(model, ref, f"step {step}")
    opt.close()


def test_bf16_parameters_get_their_masters_rounded():
    model, ref, ref_opt = cuda_model_and_cpu_reference(torch.bfloat16)
    cfg = dict(config(), bf16={"enabled": True})
    opt = zo.torch.OffloadOptimizer(model.named_parameters(), config=cfg)
    for step in range(1, STEPS + 1):
        model(batch(step).cuda()).backward()
        feed_same_gradients(model, ref)  # the bf16 gradients, as the servers get them
        opt.step()
        opt.zero_grad()
        ref_opt.step()
        ref_opt.zero_grad()
        # The served weights are the fp32 masters rounded to bf16 (one ulp apart
        # where the masters sit on a rounding boundary).
        assert_same_weights(model, ref, f"step {step}", rtol=8e-3, atol=1e-5)
    opt.close()

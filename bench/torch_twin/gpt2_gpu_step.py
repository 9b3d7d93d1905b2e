#!/usr/bin/env python3
"""The PyTorch peer of `zo-bench gpu`'s gpu_step: the same GPT on the same GPU.

Builds the GPT of gpt_lite_twin.py at GPT-2-small shape (12 blocks, width 768,
12 heads, context 1024, vocabulary 50304) with zo's initial weights
(worker/model/param.cc, seed --seed) stored in --dtype, feeds it the batch of
`zo-bench gpu` step 1 (bench/gpu_bench.cc GpuBenchToken), and prints
step 1's loss - which must equal the gpu_step row's first_loss within the
dtype's tolerance - then times forward + backward (PyTorch eager, attention
through F.scaled_dot_product_attention, i.e. its flash kernel) as the peer
figure for zo's step time. Needs torch with CUDA.

  python3 bench/torch_twin/gpt2_gpu_step.py --batch 16 --json
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_lite_twin import Block, GptLite  # noqa: E402

M64 = (1 << 64) - 1


def bench_tokens(step, micro_batch, n, vocab):
    """GpuBenchToken for i = 0 .. n-1 (numpy uint64 wraps as C++ does)."""
    with np.errstate(over="ignore"):
        i = np.arange(n, dtype=np.uint64)
        x = (i * np.uint64(0x9E3779B97F4A7C15) + np.uint64((step * 0xBF58476D1CE4E5B9) & M64)
             + np.uint64((micro_batch * 0x94D049BB133111EB) & M64))
        x ^= x >> np.uint64(31)
        x *= np.uint64(0xD6E8FEB86659FD93)
        x ^= x >> np.uint64(32)
    return (x % np.uint64(vocab)).astype(np.int64)


class FlashGpt(GptLite):
    def forward(self, tokens, targets):
        t = tokens.shape[1]
        x = self.wte[tokens] + self.wpe[:t]
        for blk in self.h:
            x = blk(x, None)
        logits = self.lm_head(self.ln_f(x))
        # fp32 softmax, as zo's cross-entropy kernel computes it.
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.reshape(-1))


class FlashBlock(Block):
    def forward(self, x, mask):
        b, t, c = x.shape
        d = c // self.heads
        q, k, v = self.qkv(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, d).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc(self.ln_2(x))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=1024)
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=768)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    dev = torch.device("cuda")
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    model = FlashGpt(a.vocab, a.block_size, a.n_layer, a.n_embd, a.n_head)
    model.h = torch.nn.ModuleList(FlashBlock(a.n_embd, a.n_head) for _ in range(a.n_layer))
    model.init_like_zo(a.seed, a.n_layer)
    model = model.to(device=dev, dtype=dtype)
    params = sum(p.numel() for p in model.parameters())
    n = a.batch * a.block_size

    def batch(step):
        ids = torch.from_numpy(bench_tokens(step, 0, n + 1, a.vocab)).to(dev)
        return ids[:n].view(a.batch, a.block_size), ids[1:].view(a.batch, a.block_size)

    times, first_loss = [], None
    for step in range(1, a.warmup + a.steps + 1):
        x, y = batch(step)
        torch.cuda.synchronize()
        start = time.perf_counter()
        model.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if step == 1:
            first_loss = loss.item()
        if step > a.warmup:
            times.append(elapsed)
    step_s = statistics.median(times)
    tokens_per_s = n / step_s
    flops = (6 * params + 12 * a.n_layer * a.n_embd * a.block_size) * n / step_s
    row = {"workload": "torch_gpu_step", "torch": torch.__version__, "dtype": a.dtype,
           "params": params, "tokens_per_step": n, "step_s": step_s,
           "tokens_per_s": tokens_per_s, "model_tflops": flops / 1e12, "first_loss": first_loss,
           "device": torch.cuda.get_device_name()}
    if a.json:
        print(json.dumps(row))
    else:
        print(f"torch {torch.__version__} on {row['device']}: {a.dtype}, {params / 1e6:.1f}M "
              f"params, {n} tokens: {step_s * 1e3:.1f} ms, {tokens_per_s:.0f} tokens/s, "
              f"{flops / 1e12:.0f} model TFLOP/s; step 1 loss {first_loss:.4f}")


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""GPT-lite as zo-train builds it, in PyTorch, to time it against zo-train.

The same model (worker/model/model.cc, transformer_block.cc): token +
position embedding, n_layer pre-LN blocks (LayerNorm, fused qkv Linear,
causal softmax attention, proj, LayerNorm, 4x MLP with erf GELU), final
LayerNorm and an untied lm_head. The same initial weights, bit for bit
before rounding (worker/model/param.cc's counter-based Box-Muller, keyed by
parameter name and --seed) and the same batches (worker/data/char_dataset.cc:
windows chosen by CounterRandom(seed, step * accumulation + micro, rank,
row)). The demo recipe of `zo-train --help`: micro-batch 16 x 2 accumulation
steps, AdamW(lr 2e-3, betas 0.9/0.99, weight decay 0.01 on every tensor),
linear warmup over 20 steps, gradient clipping at 1.0.

What it does not copy: zo-train stores activations in fp16 with dynamic loss
scaling and (after step 40) DPU; this twin computes and stores fp32 and
applies each step's gradient at once. Losses agree to about 2 decimals.

Prints one line per --print-every steps and, at the end, the tokens/s of the
steps after --warmup (forward + backward + clipping + AdamW, all in this
process on --threads intra-op threads).

  /usr/bin/python3 bench/torch_twin/gpt_lite_twin.py \
      --data ../shared/data/tinyshakespeare.txt --steps 60 --threads 2
"""

import argparse
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

MASK64 = (1 << 64) - 1


# ---- zo's counter-based random numbers (common/counter_rng.h) ----------------
def mix64(x):
    """SplitMix64's finalizer over numpy uint64 arrays or Python ints."""
    if isinstance(x, int):
        x = (x + 0x9E3779B97F4A7C15) & MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
        return x ^ (x >> 31)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def counter_random(seed, a, b=0, c=0):
    h = mix64(seed)
    h = mix64(h ^ a)
    h = mix64(h ^ b)
    return mix64(h ^ c)


def name_hash(name):
    h = 0xCBF29CE484222325
    for ch in name.encode():
        h = ((h ^ ch) * 0x100000001B3) & MASK64
    return h


def initial_values(name, shape, kind, scale, seed):
    """worker/model/param.cc InitialValues."""
    n = math.prod(shape)
    if kind == "constant":
        return torch.full(shape, float(scale))
    i = np.arange(n, dtype=np.uint64)
    h = mix64(np.uint64(mix64(mix64(seed) ^ name_hash(name))) ^ i)

    def unit(c):
        bits = mix64(h ^ np.uint64(c))
        return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53

    assert kind == "normal"
    v = scale * np.sqrt(-2 * np.log(unit(1))) * np.cos(2 * np.pi * unit(2))
    return torch.from_numpy(v.astype(np.float32)).reshape(shape)


# ---- data (worker/data/char_dataset.cc) --------------------------------------
class CharData:
    def __init__(self, path, seed):
        text = open(path, "rb").read()
        chars = sorted(set(text))
        lut = np.full(256, -1, dtype=np.int64)
        lut[chars] = np.arange(len(chars))
        self.ids = torch.from_numpy(lut[np.frombuffer(text, dtype=np.uint8)])
        self.vocab = len(chars)
        self.seed = seed

    def sample(self, batch, block, index, rank=0):
        choices = len(self.ids) - block
        rows = []
        for row in range(batch):
            r = counter_random(self.seed, index, rank, row)
            rows.append((r * choices) >> 64)
        starts = torch.tensor(rows)
        offsets = starts[:, None] + torch.arange(block + 1)[None, :]
        window = self.ids[offsets]
        return window[:, :-1], window[:, 1:]


# ---- the model ----------------------------------------------------------------
class Block(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.ln_2 = torch.nn.LayerNorm(dim)
        self.fc = torch.nn.Linear(dim, 4 * dim)
        self.fc2 = torch.nn.Linear(4 * dim, dim)

    def forward(self, x, mask):
        b, t, c = x.shape
        d = c // self.heads
        q, k, v = self.qkv(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, d).transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        p = F.softmax(s.masked_fill(mask[:t, :t], float("-inf")), dim=-1)
        y = (p @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc(self.ln_2(x))))


class GptLite(torch.nn.Module):
    def __init__(self, vocab, block, n_layer, dim, heads):
        super().__init__()
        self.wte = torch.nn.Parameter(torch.empty(vocab, dim))
        self.wpe = torch.nn.Parameter(torch.empty(block, dim))
        self.h = torch.nn.ModuleList(Block(dim, heads) for _ in range(n_layer))
        self.ln_f = torch.nn.LayerNorm(dim)
        self.lm_head = torch.nn.Linear(dim, vocab)
        self.register_buffer("mask", torch.ones(block, block, dtype=torch.bool).triu(1))

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        x = self.wte[tokens] + self.wpe[:t]
        for blk in self.h:
            x = blk(x, self.mask)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))

    def init_like_zo(self, seed, n_layer):
        """Names and init kinds of worker/model/model.cc and transformer_block.cc."""
        w, w_res = ("normal", 0.02), ("normal", 0.02 / math.sqrt(2.0 * n_layer))
        one, zero = ("constant", 1.0), ("constant", 0.0)
        plan = {"embed.wte": (self.wte, w), "embed.wpe": (self.wpe, w),
                "ln_f.weight": (self.ln_f.weight, one), "ln_f.bias": (self.ln_f.bias, zero),
                "lm_head.weight": (self.lm_head.weight, w),
                "lm_head.bias": (self.lm_head.bias, zero)}
        for i, blk in enumerate(self.h):
            for suffix, p, init in [
                    ("ln_1.weight", blk.ln_1.weight, one), ("ln_1.bias", blk.ln_1.bias, zero),
                    ("attn.qkv.weight", blk.qkv.weight, w), ("attn.qkv.bias", blk.qkv.bias, zero),
                    ("attn.proj.weight", blk.proj.weight, w_res),
                    ("attn.proj.bias", blk.proj.bias, zero),
                    ("ln_2.weight", blk.ln_2.weight, one), ("ln_2.bias", blk.ln_2.bias, zero),
                    ("mlp.fc.weight", blk.fc.weight, w), ("mlp.fc.bias", blk.fc.bias, zero),
                    ("mlp.proj.weight", blk.fc2.weight, w_res),
                    ("mlp.proj.bias", blk.fc2.bias, zero)]:
                plan[f"h.{i}.{suffix}"] = (p, init)
        assert len(plan) == len(list(self.parameters()))
        with torch.no_grad():
            for name, (p, (kind, scale)) in plan.items():
                p.copy_(initial_values(name, tuple(p.shape), kind, scale, seed))


def add_recipe_args(ap):
    """The model's shape and the batches of the demo recipe (zo-train --help)."""
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--accumulation", type=int, default=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="text file (zo-train --data)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10, help="steps left out of tokens/s")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--seed", type=int, default=1337)
    add_recipe_args(ap)
    ap.add_argument("--print-every", type=int, default=10)
    ap.add_argument("--json", action="store_true", help="last line: a JSON summary")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    data = CharData(a.data, a.seed)
    model = GptLite(data.vocab, a.block_size, a.n_layer, a.n_embd, a.n_head)
    model.init_like_zo(a.seed, a.n_layer)
    # One group with decay on every tensor, as a DeepSpeed config optimizer does.
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.99), eps=1e-8,
                            weight_decay=0.01)
    tokens_per_step = a.micro_batch * a.accumulation * a.block_size
    timed_s, timed_tokens = 0.0, 0
    for step in range(1, a.steps + 1):
        batches = [data.sample(a.micro_batch, a.block_size, step * a.accumulation + m)
                   for m in range(a.accumulation)]  # drawn before the clock, as zo's are cheap
        start = time.perf_counter()
        for g in opt.param_groups:  # WarmupLR, linear, 20 steps from 0
            g["lr"] = 2e-3 * min(1.0, (step - 1) / 20)
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for x, y in batches:
            loss = model(x, y) / a.accumulation
            loss.backward()
            loss_sum += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        elapsed = time.perf_counter() - start
        if step > a.warmup:
            timed_s += elapsed
            timed_tokens += tokens_per_step
        if step == 1 or step % a.print_every == 0 or step == a.steps:
            print(f"step {step:4d} | loss {loss_sum:.4f} | {tokens_per_step / elapsed:8.0f} "
                  f"tokens/s", flush=True)
    rate = timed_tokens / timed_s if timed_s > 0 else float("nan")
    print(f"twin: {rate:.0f} tokens/s over steps {a.warmup + 1}..{a.steps} "
          f"(torch {torch.__version__}, {torch.get_num_threads()} threads)", flush=True)
    if a.json:
        print(json.dumps({"tokens_per_s": rate, "steps": a.steps - a.warmup}))


if __name__ == "__main__":
    sys.exit(main())

"""zo.torch's engine step on a fresh model against a warmed one.

An engine that allocates per step (a new full-size gradient per parameter in
its hooks, or .grad set to None by zero_grad so autograd allocates it again)
pays page faults every iteration; one whose gradients accumulate in buffers
allocated once pays them on the first step only. This times iterations
(forward, backward with the pushes, step) of an MLP of --params parameters
trained by zo.torch.initialize with an embedded server: the first --measure
iterations of a fresh model against the same number after --warm more, and
prints the medians and their ratio (1 within noise is the goal).

    PYTHONPATH=build/release/python /usr/bin/python3 bench/torch_twin/engine_fresh_vs_warm.py
"""

import argparse
import json
import statistics
import time

import torch

import zo.torch


def mlp(params, width):
    layers = max(1, params // (width * width))
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*blocks)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=16 << 20, help="about this many parameters")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--measure", type=int, default=5, help="iterations timed in each phase")
    ap.add_argument("--warm", type=int, default=10, help="iterations between the phases")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="the job's dtype (bf16: gradients cast into kept buffers)")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = mlp(a.params, a.width)
    cfg = {"train_batch_size": a.batch, "train_micro_batch_size_per_gpu": a.batch,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}}
    if a.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    engine, opt, _, _ = zo.torch.initialize(model=model, config=cfg)
    x = torch.randn(a.batch, a.width)

    def iteration():
        start = time.perf_counter()
        loss = engine(x).square().mean()
        engine.backward(loss)
        engine.step()
        return time.perf_counter() - start

    fresh = [iteration() for _ in range(a.measure)]
    for _ in range(a.warm):
        iteration()
    warm = [iteration() for _ in range(a.measure)]
    n = sum(p.numel() for p in model.parameters())
    row = {"params": n, "dtype": a.dtype, "torch": torch.__version__,
           "fresh_ms": [round(t * 1e3, 1) for t in fresh],
           "warm_ms": [round(t * 1e3, 1) for t in warm],
           "fresh_median_ms": round(statistics.median(fresh) * 1e3, 1),
           "warm_median_ms": round(statistics.median(warm) * 1e3, 1)}
    row["fresh_over_warm"] = round(row["fresh_median_ms"] / row["warm_median_ms"], 3)
    print(json.dumps(row))
    opt.close()


if __name__ == "__main__":
    main()

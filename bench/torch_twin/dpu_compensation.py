#!/usr/bin/python3
"""What a delayed parameter update costs GPT-lite, and what compensates it.

The twin of gpt_lite_twin.py (zo-train's demo model, initial weights,
batches and recipe) trained with the staleness of zo's DPU: from step
--dpu-from on, step s computes its gradient on the weights after step s-2
(the servers are still applying step s-1 while the worker computes),
and the servers apply it to the weights after step s-1. Modes, each what
the servers could do because they hold the master weights, both versions
and Adam's moments:

  sync      no DPU: step s computes on the weights after step s-1
  stale     DPU as zo runs it today
  dc        delay compensation (DC-ASGD's, with Adam's second moment as its
            adaptive scale): g + lam * g * g / (sqrt(v) + eps) * (w_{s-1} - w_{s-2}),
            the gradient moved to the weights it is applied to by a diagonal
            estimate of the Hessian
  predict   the servers serve, instead of w_{s-2}, their prediction of w_{s-1}:
            w_{s-2} moved one Adam step along its own moments (the update of
            step s-1 with its unknown gradient replaced by the momentum),
            computed when step s-2's update ends
  extrap    w_{s-2} + (w_{s-2} - w_{s-3}): the last step repeated
  momentum  stale, with Adam's beta1 lowered to --dpu-beta1 while delayed (a
            delay acts as extra momentum: asynchrony begets momentum)
  worker    the servers serve w_{s-2} moved by the momentum's part of step
            s-1 only, w_{s-2} (1 - lr wd) - lr beta1 m_{s-2} / (c1 d), and a
            gain k = lr (1 - beta1) / (c1 (sqrt(v / c2) + eps)) with v's mean
            over each tensor; the worker, which still holds step s-1's
            gradient g (clipped), computes on served - k g: step s-1 whole
            but for v's last update and the gain's averaging
  worker_factored  the same with v of a matrix factored into its row and
            column sums (Adafactor's factoring: a row and a column vector
            to send), vectors exact
  worker_exact     the same with the gain per element (the bound: sync but
            for v's last update)
  worker_delta     the servers send only the gain (v's mean per tensor);
            the worker forms the momentum's part itself from the last two
            versions it pulled: w_{s-2} (1 - lr_{s-1} wd) + a (w_{s-2} -
            w_{s-3} + lr_{s-2} wd w_{s-3}), a = beta1 (lr_{s-1} / lr_{s-2})
            (c1_{s-2} / c1_{s-1}) sqrt(c2_{s-1} / c2_{s-2}) (step s-2's
            update without its decay, turned into step s-1's momentum part
            but for eps), then subtracts k g as `worker` does

--served-dtype rounds every version the servers serve (and so the weights
each step computes on) to fp16 or bf16, as zo's pulls do.

Clipping uses the raw gradient's norm (the servers decide it from the
statistics of the pushed gradients) and compensation follows it. Prints, per
mode and seed, the mean training loss of the last --window steps (each
step's loss on the weights it computed on, as zo-train logs it), then a JSON
line per mode with the means over seeds and the gap to sync.

  OMP_WAIT_POLICY=PASSIVE OPENBLAS_CORETYPE=Haswell /usr/bin/python3 \\
      bench/torch_twin/dpu_compensation.py --data ../shared/data/tinyshakespeare.txt \\
      --steps 600 --seeds 1337,1338,1339 --modes sync,stale,dc,predict,worker
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_lite_twin import CharData, GptLite, add_recipe_args  # noqa: E402

LR, BETAS, EPS, DECAY, WARMUP, CLIP = 2e-3, (0.9, 0.99), 1e-8, 0.01, 20, 1.0
MODES = ("sync", "stale", "dc", "predict", "extrap", "momentum", "worker", "worker_exact",
         "worker_factored", "worker_delta")


class Adam:
    """AdamW over fp32 master tensors, written out so that its moments are at
    hand for the compensations (the same update as torch.optim.AdamW)."""

    def __init__(self, params):
        self.p = params
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    def step(self, grads, lr, beta1=None):
        self.t += 1
        b1, b2 = BETAS
        b1 = b1 if beta1 is None else beta1
        c1, c2 = 1 - BETAS[0]**self.t, 1 - b2**self.t
        for p, m, v, g in zip(self.p, self.m, self.v, grads):
            p.mul_(1 - lr * DECAY)
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            p.addcdiv_(m / c1, (v / c2).sqrt_().add_(EPS), value=-lr)

    def predict(self, lr, momentum_weight=1.0):
        """The weights after one more step whose gradient equals the momentum
        (momentum_weight 1), or that leaves the new gradient's part out
        (momentum_weight beta1: the worker adds it)."""
        b1, b2 = BETAS
        t = self.t + 1
        c1, c2 = 1 - b1**t, 1 - b2**t
        return [p * (1 - lr * DECAY) - lr * momentum_weight * (m / c1) / ((v / c2).sqrt() + EPS)
                for p, m, v in zip(self.p, self.m, self.v)]

    def gradient_gain(self, lr, kind):
        """What the next step moves a weight per unit of its new gradient:
        lr (1 - beta1) / (c1 (sqrt(v / c2) + eps)), per element ("exact"),
        with v of a matrix factored into its row and column sums as
        Adafactor does ("factored": what a server could send a worker in a
        row and a column vector), or one gain per tensor from v's mean
        ("mean")."""
        b1, b2 = BETAS
        t = self.t + 1
        c1, c2 = 1 - b1**t, 1 - b2**t
        gains = []
        for v in self.v:
            if kind == "factored" and v.dim() == 2:
                v = torch.outer(v.sum(1), v.sum(0)) / v.sum().clamp_min(1e-30)
            elif kind == "mean":
                v = v.mean().expand_as(v)
            gains.append(lr * (1 - b1) / c1 / ((v / c2).sqrt() + EPS))
        return gains


def lr_at(step):
    return LR * min(1.0, (step - 1) / WARMUP)


def momentum_part_from_versions(w2, w3, t):
    """w_{t} moved by the momentum's part of step t+1, from the versions t
    and t-1 alone (Adam's count after step t is t: no skipped steps here)."""
    b1, b2 = BETAS
    lr_next, lr_last = lr_at(t + 1), lr_at(t)
    if lr_last == 0:
        return [w.clone() for w in w2]
    a = b1 * (lr_next / lr_last) * ((1 - b1**t) / (1 - b1**(t + 1))) * \
        ((1 - b2**(t + 1)) / (1 - b2**t)) ** 0.5
    return [w * (1 - lr_next * DECAY) + a * (w - u + lr_last * DECAY * u) for w, u in zip(w2, w3)]


def train(a, data, mode, seed):
    torch.manual_seed(seed)
    model = GptLite(data.vocab, a.block_size, a.n_layer, a.n_embd, a.n_head)
    model.init_like_zo(seed, a.n_layer)
    params = list(model.parameters())
    master = [p.detach().clone() for p in params]
    opt = Adam(master)
    # versions[k]: the weights after step k (0: the initial ones), the last
    # three kept; predicted[k]: the prediction of version k made after k-1.
    served_dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[a.served_dtype]

    def serve(ws):
        return [w.clone() if served_dtype is None else w.to(served_dtype).float() for w in ws]

    versions = {0: serve(master)}
    predicted = {}
    losses, master_losses = [], []
    for step in range(1, a.steps + 1):
        if a.eval_master and step > a.steps - a.window:
            # The loss on the weights a synchronous step would compute on
            # (the master after step s-1), on the same batches.
            with torch.no_grad():
                for p, w in zip(params, master):
                    p.copy_(w)
                master_losses.append(sum(
                    model(*data.sample(a.micro_batch, a.block_size, step * a.accumulation + micro))
                    .item() / a.accumulation for micro in range(a.accumulation)))
        delayed = mode != "sync" and step >= a.dpu_from
        on = step - 2 if delayed else step - 1
        if delayed and mode == "predict" and step - 1 in predicted:
            weights = predicted[step - 1]
        elif delayed and mode in ("worker", "worker_exact", "worker_factored") and step - 1 in predicted:
            # The servers serve w_{s-2} moved by the momentum's part of step
            # s-1; the worker, which still holds step s-1's gradient, adds
            # its part with the gain the servers sent.
            served, gain = predicted[step - 1]
            weights = [w - k * g for w, k, g in zip(served, gain, last_grads)]
        elif delayed and mode == "worker_delta" and step - 1 in predicted and step - 3 in versions:
            gain = predicted[step - 1]
            weights = [w - k * g for w, k, g in
                       zip(momentum_part_from_versions(versions[step - 2], versions[step - 3],
                                                       step - 2),
                           gain, last_grads)]
        elif delayed and mode == "extrap" and on - 1 in versions:
            weights = [2 * w - u for w, u in zip(versions[on], versions[on - 1])]
        else:
            weights = versions[on]
        with torch.no_grad():
            for p, w in zip(params, weights):
                p.copy_(w)
        for p in params:
            p.grad = None
        loss_sum = 0.0
        for micro in range(a.accumulation):
            x, y = data.sample(a.micro_batch, a.block_size, step * a.accumulation + micro)
            loss = model(x, y) / a.accumulation
            loss.backward()
            loss_sum += loss.item()
        losses.append(loss_sum)
        grads = [p.grad.detach().clone() for p in params]
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()
        if norm > CLIP:
            for g in grads:
                g.mul_(CLIP / (norm + 1e-6))
        if delayed and mode == "dc":
            for g, w, u, v in zip(grads, master, versions[on], opt.v):
                denom = (v / (1 - BETAS[1]**max(opt.t, 1))).sqrt_().add_(EPS)
                g.add_(a.dc_lambda * g * g / denom * (w - u))
        opt.step(grads, lr_at(step), a.dpu_beta1 if delayed and mode == "momentum" else None)
        versions[step] = serve(master)
        versions.pop(step - 3, None)
        if mode == "predict":
            predicted[step + 1] = opt.predict(lr_at(step + 1))
            predicted.pop(step - 1, None)
        if mode in ("worker", "worker_exact", "worker_factored"):
            predicted[step + 1] = (opt.predict(lr_at(step + 1), BETAS[0]),
                                   opt.gradient_gain(lr_at(step + 1), {"worker": "mean", "worker_exact": "exact",
                                                        "worker_factored": "factored"}[mode]))
            predicted.pop(step - 1, None)
        if mode == "worker_delta":
            predicted[step + 1] = opt.gradient_gain(lr_at(step + 1), "mean")
            predicted.pop(step - 1, None)
        last_grads = grads
        if step % a.print_every == 0:
            print(f"  {mode} seed {seed} step {step:4d} loss {loss_sum:.4f}", flush=True)
    return losses, master_losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="text file (zo-train --data)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--dpu-from", type=int, default=42,
                    help="first step computed on the version before the last (zo-train's demo, "
                         "dpu.warmup_steps 40: step 42, common/dpu_policy.h)")
    ap.add_argument("--window", type=int, default=20, help="steps at the end averaged")
    ap.add_argument("--seeds", default="1337,1338,1339")
    ap.add_argument("--modes", default="sync,stale,dc,predict")
    ap.add_argument("--dc-lambda", type=float, default=100.0)
    ap.add_argument("--dpu-beta1", type=float, default=0.8, help="momentum: beta1 while delayed")
    ap.add_argument("--eval-master", action="store_true",
                    help="also give the last window's loss on the master weights (after step s-1)")
    ap.add_argument("--served-dtype", choices=("fp32", "fp16", "bf16"), default="fp32",
                    help="what the servers' versions are rounded to")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    add_recipe_args(ap)
    ap.add_argument("--print-every", type=int, default=100)
    a = ap.parse_args()
    modes = a.modes.split(",")
    for m in modes:
        if m not in MODES:
            ap.error(f"--modes: unknown mode '{m}' (one of {', '.join(MODES)})")
    seeds = [int(s) for s in a.seeds.split(",")]
    if a.window < 1 or a.window > a.steps:
        ap.error("--window must be in 1..--steps")
    torch.set_num_threads(a.threads)
    means = {}
    for seed in seeds:
        data = CharData(a.data, seed)
        for mode in modes:
            start = time.perf_counter()
            losses, master_losses = train(a, data, mode, seed)
            mean = sum(losses[-a.window:]) / a.window
            if master_losses:
                print(f"{mode} seed {seed}: on the master weights "
                      f"{sum(master_losses) / a.window:.4f}", flush=True)
            means.setdefault(mode, []).append(mean)
            print(f"{mode} seed {seed}: mean loss of steps {a.steps - a.window + 1}..{a.steps} "
                  f"{mean:.4f} ({time.perf_counter() - start:.0f} s)", flush=True)
    sync = means.get("sync")
    for mode, values in means.items():
        row = {"mode": mode, "seeds": seeds, "steps": a.steps, "dpu_from": a.dpu_from,
               "served_dtype": a.served_dtype,
               "window": a.window, "mean_loss": values, "mean": sum(values) / len(values)}
        if mode == "dc":
            row["dc_lambda"] = a.dc_lambda
        if mode == "momentum":
            row["dpu_beta1"] = a.dpu_beta1
        if sync is not None:
            row["gap_to_sync"] = [v - s for v, s in zip(values, sync)]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())

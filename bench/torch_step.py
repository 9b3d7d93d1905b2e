"""zo.torch's OffloadOptimizer.step() against the server's Adam alone.

A step with no forward or backward in it: every gradient pushed, the
servers' update, every weight pulled back into the parameters. Timed per
route: `embedded` (servers=None: the embedded server, its data on the
in-process route) and `same_host` (a zo-server process on this host: the
data in a shared-memory region, the headers over loopback TCP). The Adam
alone is `zo-bench adam` over as many parameters with the same threads (it
also writes a 16-bit copy, which a server serving from its master does
not: a slightly slower baseline). Jobs (--dtypes): fp32 and bf16 over
parameters of their own dtype, and bf16-over-fp32, an fp32 model with bf16
in the config (each gradient rounded on its way out, each weight widened
back); the Adam alone is the job's (bf16 gradients for both bf16 jobs).

    PYTHONPATH=build/release/python /usr/bin/python3 bench/torch_step.py --json

--grads (optimizer API): `fresh`, .grad in memory of its own each step, as
after zero_grad() (set_to_none=True, torch's default) and a backward; and
`kept`, the loop zeroes .grad with zero_grad(set_to_none=False) and the
backward sums into it, which on the same-host route puts .grad in the
shared region where the server reads it. The backward is a copy of the
step's gradient into .grad (fresh) or added to it (kept), outside the time.

--rounds R (default 3) pairs the two in time: each round times the Adam
alone, then each route, so that a machine whose speed drifts (the Adam
alone read 14-25 ms between runs of one afternoon on a shared 2-core host)
moves both sides of a ratio together. step_s and adam_s are medians over
the rounds (each round's own figure a median over --steps steps, or over
zo-bench's rounds), ratio the median of the rounds' own ratios, with their
least and greatest.

Rows: {"bench": "torch_step", "api", "grads", "route", "dtype", "params",
"tensors", "rounds", "step_s", "adam_s", "ratio", "ratio_min",
"ratio_max"} (ratio = step / adam, round by round), then per dtype and
grads {"bench": "torch_step_routes", "api", "grads", "dtype",
"same_host_over_embedded"} (likewise paired). Targets (issue 34): embedded
<= 1.5 x the Adam, same_host <= 1.3 x embedded.

--api engine times zo.torch.initialize's engine instead: a whole iteration
(a forward of one multiply-and-sum per tensor, engine.backward, whose hooks
push each gradient, and engine.step), so step_s holds that compute too and
the figure to read is same_host_over_embedded. The engine keeps .grad
between steps, on the same-host route in the server's region.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

import torch

import zo.torch

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_BIN = os.path.join(HERE, "..", "build", "release", "bin")


def binary(name, flag):
    if flag:
        return flag
    local = os.path.join(BUILD_BIN, name)
    return local if os.path.exists(local) else shutil.which(name)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def adam_alone(zo_bench, params, dtype, threads):
    grad = DTYPES[dtype][0] or "fp32"
    out = subprocess.run(
        [zo_bench, "--params", str(params), "--threads", str(threads), "--rounds", "5",
         "--grad-dtype", grad, "--json", "adam"],
        check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        row = json.loads(line)
        if row["dispatched"]:
            return row["params"] / row["params_per_s"]
    raise RuntimeError("zo-bench adam printed no dispatched row")


# A job's dtype -> (its config's 16-bit section or None, the parameters' dtype).
# "bf16-over-fp32": an fp32 model with bf16 in the config, the common way in
# (each gradient is rounded to bf16 on its way out, each weight widened back).
DTYPES = {"fp32": (None, torch.float32), "bf16": ("bf16", torch.bfloat16),
          "bf16-over-fp32": ("bf16", torch.float32)}


def time_steps(params, tensors, dtype, servers, steps, grads="fresh"):
    torch.manual_seed(0)
    section, tdtype = DTYPES[dtype]
    per = params // tensors
    weights = [torch.nn.Parameter(torch.randn(per, dtype=tdtype) * 0.02)
               for _ in range(tensors)]
    named = [(f"w{i}", w) for i, w in enumerate(weights)]
    computed = [torch.randn_like(w) * 1e-3 for w in weights]
    fresh = [torch.empty_like(w) for w in weights]

    def backward():
        for w, g, f in zip(weights, computed, fresh):
            if grads == "kept" and w.grad is not None:
                w.grad.add_(g)  # summed into the zeroed .grad, where it lies
            else:
                w.grad = f.copy_(g)  # memory of its own (the same each step)
    config = {"train_batch_size": 1, "steps_per_print": 1 << 30,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}}
    if section is not None:
        config[section] = {"enabled": True}
    opt = zo.torch.OffloadOptimizer(named, config=config, servers=servers,
                                    job=f"torch-step-{dtype}-{time.time_ns()}")
    backward()
    opt.step()  # warm-up: the servers' state first touched

    def zero_grad():
        if grads == "kept":
            opt.zero_grad(set_to_none=False)
        else:
            opt.zero_grad()

    times = []
    for _ in range(steps):
        zero_grad()
        backward()
        start = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - start)
    del opt
    return statistics.median(times)


class _Elementwise(torch.nn.Module):
    """A model whose backward costs little beside the step: the loss is
    sum(w * c) over its tensors, so each gradient is c."""

    def __init__(self, weights):
        super().__init__()
        self.ws = torch.nn.ParameterList(weights)
        self.cs = [torch.randn_like(w) for w in weights]

    def forward(self):
        return sum((w * c).sum() for w, c in zip(self.ws, self.cs))


def time_engine_steps(params, tensors, dtype, servers, steps):
    torch.manual_seed(0)
    section, tdtype = DTYPES[dtype]
    per = params // tensors
    model = _Elementwise([torch.nn.Parameter(torch.randn(per, dtype=tdtype) * 0.02)
                          for _ in range(tensors)])
    config = {"train_batch_size": 1, "steps_per_print": 1 << 30,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}}
    if section is not None:
        config[section] = {"enabled": True}
    engine, opt, _, _ = zo.torch.initialize(model=model, config=config, servers=servers,
                                            job=f"torch-engine-{dtype}-{time.time_ns()}")

    def iteration():
        engine.backward(engine())
        engine.step()

    iteration()  # warm-up: the servers' state first touched
    iteration()  # and the engine's .grad kept from now on
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        iteration()
        times.append(time.perf_counter() - start)
    opt.close()
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=32 << 20)
    ap.add_argument("--tensors", type=int, default=16,
                    help="the parameters are cut into this many tensors (GPT-2 small has 148)")
    ap.add_argument("--dtypes", default="fp32,bf16,bf16-over-fp32",
                    help=f"jobs to time, of {', '.join(DTYPES)}")
    ap.add_argument("--routes", default="embedded,same_host")
    ap.add_argument("--steps", type=int, default=7, help="timed steps, after one warm-up")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of the Adam alone and each route, alternating")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="the servers' optimizer threads and the Adam's")
    ap.add_argument("--zo-server", default=None)
    ap.add_argument("--zo-bench", default=None)
    ap.add_argument("--api", choices=("optimizer", "engine"), default="optimizer",
                    help="time OffloadOptimizer.step() (default), or a whole iteration of "
                         "zo.torch.initialize's engine")
    ap.add_argument("--grads", default="fresh,kept",
                    help="optimizer API: .grad made fresh each step (zero_grad()), kept and "
                         "zeroed (zero_grad(set_to_none=False)), or both")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.rounds < 1 or a.steps < 1:
        ap.error("--rounds and --steps take at least 1")
    zo_bench = binary("zo-bench", a.zo_bench)
    zo_server = binary("zo-server", a.zo_server)
    if zo_bench is None or ("same_host" in a.routes and zo_server is None):
        sys.exit("torch_step: build zo-bench and zo-server first (or give --zo-bench/--zo-server)")
    torch.set_num_threads(1)

    server = None
    address = None
    if "same_host" in a.routes:
        address = f"127.0.0.1:{free_port()}"
        server = subprocess.Popen([zo_server, "--listen", address, "--threads", str(a.threads)],
                                  stderr=subprocess.DEVNULL)
    try:
        # The engine keeps .grad (zeroed) between its steps.
        grad_modes = ["kept"] if a.api == "engine" else a.grads.split(",")
        routes = a.routes.split(",")
        for dtype in a.dtypes.split(","):
            # Per round: the Adam alone, then each grads mode and route.
            adam = []
            steps = {(g, r): [] for g in grad_modes for r in routes}
            for round_ in range(a.rounds):
                adam.append(adam_alone(zo_bench, a.params, dtype, a.threads))
                for grads, route in steps:
                    servers = None if route == "embedded" else [address]
                    print(f"torch_step: round {round_ + 1} of {a.rounds}: {a.api} {dtype} "
                          f"{grads} {route}: {a.steps} steps", file=sys.stderr)
                    if a.api == "engine":
                        t = time_engine_steps(a.params, a.tensors, dtype, servers, a.steps)
                    else:
                        t = time_steps(a.params, a.tensors, dtype, servers, a.steps, grads)
                    steps[grads, route].append(t)
            adam_s = statistics.median(adam)
            for grads in grad_modes:
                for route in routes:
                    ts = steps[grads, route]
                    ratios = [t / x for t, x in zip(ts, adam)]
                    row = {"bench": "torch_step", "api": a.api, "grads": grads, "route": route,
                           "dtype": dtype, "params": a.params, "tensors": a.tensors,
                           "rounds": a.rounds, "step_s": statistics.median(ts),
                           "adam_s": adam_s, "ratio": statistics.median(ratios),
                           "ratio_min": min(ratios), "ratio_max": max(ratios)}
                    print(json.dumps(row) if a.json else
                          f"{a.api:9} {dtype:14} {grads:5} {route:10} step "
                          f"{1e3 * row['step_s']:7.1f} ms   adam {1e3 * adam_s:6.1f} ms   "
                          f"ratio {row['ratio']:.2f} ({row['ratio_min']:.2f}-"
                          f"{row['ratio_max']:.2f})", flush=True)
                if "embedded" in routes and "same_host" in routes:
                    r = statistics.median([sh / em for sh, em in zip(steps[grads, "same_host"],
                                                                     steps[grads, "embedded"])])
                    print(json.dumps({"bench": "torch_step_routes", "api": a.api, "grads": grads,
                                      "dtype": dtype, "same_host_over_embedded": r}) if a.json else
                          f"{a.api:9} {dtype:14} {grads:5} same_host / embedded = {r:.2f}",
                          flush=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Our CPU Adam step against torch.optim.AdamW on the same parameter count.

Times torch.optim.AdamW (foreach and for-loop implementations) on fp32
parameters and fp32 gradients, split into tensors of --chunk-elems elements as
a server's chunks are, at each thread count (torch.set_num_threads), then runs
`zo-bench adam --json` with the same settings and prints our speed-up per
thread count (dispatched SIMD path). zo additionally writes the fp16 copy of
the new weights, which torch does not.

Installs Debian's python3-torch with apt when `import torch` fails (this
script only; the tests never need torch).

  bench/compare_torch.py --params 64M --threads 1,2
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ensure_torch():
    try:
        import torch  # noqa: F401
        return torch
    except ImportError:
        pass
    print("compare_torch: `import torch` failed; installing Debian's python3-torch",
          file=sys.stderr)
    if not sys.executable.startswith("/usr/bin/"):
        print(f"compare_torch: note: {sys.executable} may not see Debian's dist-packages; "
              "run with /usr/bin/python3 if the import still fails", file=sys.stderr)
    apt = ["apt-get", "install", "-y", "--no-install-recommends", "python3-torch"]
    if os.geteuid() != 0:
        if not shutil.which("sudo"):
            sys.exit("compare_torch: not root and no sudo; install python3-torch yourself")
        apt = ["sudo"] + apt
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # apt's chatter goes to stderr: stdout carries only the results.
    if subprocess.run(apt, env=env, stdout=sys.stderr).returncode != 0:
        update = (["sudo"] if apt[0] == "sudo" else []) + ["apt-get", "update"]
        subprocess.run(update, env=env, stdout=sys.stderr, check=True)
        subprocess.run(apt, env=env, stdout=sys.stderr, check=True)
    import torch
    return torch


def parse_count(text):
    """256Mi, 4Ki, 64M (decimal), 1.3B, 1e8 or a plain integer."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*(Ki|Mi|Gi|k|K|M|m|B|b)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}")
    scale = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 1e3, "K": 1e3,
             "M": 1e6, "m": 1e6, "B": 1e9, "b": 1e9}[m.group(2)]
    value = int(float(m.group(1)) * scale)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def parse_threads(text):
    try:
        counts = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want counts like 1,2,4, got {text!r}")
    if any(t < 1 for t in counts):
        raise argparse.ArgumentTypeError(f"thread counts must be >= 1, got {text!r}")
    return counts


def time_torch(torch, params, chunk_elems, threads, steps, foreach):
    """Median seconds per AdamW step."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    tensors = []
    for begin in range(0, params, chunk_elems):
        n = min(chunk_elems, params - begin)
        p = torch.empty(n, dtype=torch.float32).uniform_(-1, 1).requires_grad_()
        p.grad = torch.empty(n, dtype=torch.float32).uniform_(-1e-2, 1e-2)
        tensors.append(p)
    opt = torch.optim.AdamW(tensors, lr=1e-3, weight_decay=0.01, foreach=foreach)
    opt.step()  # allocates the moments
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - start)
    del opt, tensors
    return statistics.median(times)


def run_zo_bench(path, args):
    cmd = [path, "adam", "--json", f"--params={args.params}",
           "--threads=" + ",".join(map(str, args.threads)), f"--grad-dtype={args.grad_dtype}",
           f"--rounds={args.steps}", f"--chunk-elems={args.chunk_elems}"]
    print("compare_torch: " + " ".join(cmd), file=sys.stderr)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout
    results = {}
    for line in out.splitlines():
        row = json.loads(line)
        if row.get("bench") == "adam" and row.get("dispatched"):
            results[row["threads"]] = row
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=parse_count, default=parse_count("256Mi"),
                        help="parameter count (default 256Mi = 268435456; 64M is decimal)")
    parser.add_argument("--threads", type=parse_threads,
                        default=list(range(1, (os.cpu_count() or 1) + 1)),
                        help="comma-separated thread counts (default 1..cores)")
    parser.add_argument("--steps", type=int, default=5,
                        help="timed steps per variant (torch) and rounds (zo-bench); median")
    parser.add_argument("--chunk-elems", type=parse_count, default=parse_count("4Mi"),
                        help="elements per tensor / chunk (default 4Mi)")
    parser.add_argument("--grad-dtype", default="fp32", choices=["fp32", "fp16", "bf16"],
                        help="gradient dtype zo-bench reads (torch always uses fp32)")
    parser.add_argument("--zo-bench", default=os.path.join(REPO, "build/release/bin/zo-bench"),
                        help="path to zo-bench (default: build/release/bin/zo-bench)")
    args = parser.parse_args()
    if not os.access(args.zo_bench, os.X_OK):
        sys.exit(f"compare_torch: {args.zo_bench} is not an executable; build it or pass "
                 "--zo-bench")

    torch = ensure_torch()
    print(f"compare_torch: torch {torch.__version__}, {args.params} params", file=sys.stderr)
    torch_rows = {}
    for t in args.threads:
        row = {}
        for name, foreach in (("foreach", True), ("for-loop", False)):
            print(f"compare_torch: torch AdamW {name}, {t} threads", file=sys.stderr)
            row[name] = args.params / time_torch(torch, args.params, args.chunk_elems, t,
                                                 args.steps, foreach)
        torch_rows[t] = row
    zo = run_zo_bench(args.zo_bench, args)

    print(f"AdamW step, {args.params} params (fp32 master/moments; torch fp32 grads, "
          f"zo {args.grad_dtype} grads + fp16 copy); Mparams/s, median of {args.steps}")
    print(f"{'threads':>7} {'torch foreach':>14} {'torch for-loop':>15} {'zo':>10} "
          f"{'zo path':>8} {'vs foreach':>11} {'vs for-loop':>12}")
    for t in args.threads:
        z = zo.get(t)
        if z is None:
            print(f"{t:>7} zo-bench gave no dispatched result")
            continue
        tf, tl, zp = torch_rows[t]["foreach"], torch_rows[t]["for-loop"], z["params_per_s"]
        print(f"{t:>7} {tf / 1e6:>14.1f} {tl / 1e6:>15.1f} {zp / 1e6:>10.1f} {z['path']:>8} "
              f"{zp / tf:>10.2f}x {zp / tl:>11.2f}x")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""DeepSpeed beside zo: one model, one batch sequence, three trainers (and
torch.optim as a compute-alone reference), one run.

A Hugging Face GPT2LMHeadModel (built from a GPT2Config: random init,
nothing downloaded) is trained on the CPU (or with --device cuda on the GPU,
DeepSpeed then with its CUDA accelerator and NCCL; the optimizers stay on
the CPU) by

  deepspeed  DeepSpeed itself: ZeRO stage 2, offload_optimizer.device "cpu"
             (DeepSpeedCPUAdam from its JIT op builder), its CPU accelerator
             (DS_ACCELERATOR=cpu, gloo), one rank (RANK=0 WORLD_SIZE=1 ...);
  zo-embed   zo.torch.initialize(servers=None): an embedded server in the
             training process;
  zo-host    zo.torch.initialize(servers=[...]) against a zo-server process
             started on this host (--listen 127.0.0.1:0);
  torch      (unless --no-torch) plain torch.optim.AdamW in the training
             process, clip_grad_norm_: no offload at all. Its forward and
             backward are the model's compute alone, which the offload
             trainers' steps can be measured against.

All of them get the same config dict (AdamW, lr, betas, eps, weight decay,
gradient clipping, no scheduler), the same initial weights (built once in
this process and saved; each trainer loads them) and the same batches (a
seeded generator, saved alongside). Each trainer runs in its own process, one
after the other (DeepSpeed sets up a process group and a JIT-built op; zo's
trainers must not share the cores with it); --rounds repeats that sequence,
alternating the trainers, for a machine whose load varies. A step is what
the training loop waits for: engine(x) forward, engine.backward(loss),
engine.step().

Prints the losses per step side by side (round 1), then one JSON row:
median step times (steps after --warmup, all rounds), the ratios zo /
DeepSpeed, each one's offload overhead (its step less torch's forward and
backward) and their ratio, the worst relative loss gap of each zo trainer
(and torch) to DeepSpeed over all rounds, the median forward / backward /
step split of each trainer, inside the step DeepSpeed's CPU Adam call and
zo's pushes, wait for the servers and pull, versions and the load average.
Exits 1 when a zo trainer's loss gap exceeds the tolerance (1e-3 with fp32;
3e-2 with bf16, whose weights and gradients are bf16 on both sides but
rounded at different places), 2 when a trainer fails.

Needs a Python with torch, transformers and deepspeed (bench/anchors/README.md
sets up build/venv/anchors) and zo on PYTHONPATH:

  PYTHONPATH=build/release/python OMP_NUM_THREADS=1 \\
      build/venv/anchors/bin/python bench/anchors/deepspeed_beside_zo.py --steps 20
"""

import argparse
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TRAINERS = ("deepspeed", "zo-embed", "zo-host", "torch")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        epilog="Trainers run one after the other, each in its own process; "
               "see the module docstring and bench/anchors/README.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps per trainer")
    ap.add_argument("--warmup", type=int, default=3,
                    help="first steps left out of the median step times")
    ap.add_argument("--n-layer", type=int, default=4, help="GPT-2 blocks")
    ap.add_argument("--n-embd", type=int, default=512, help="model width")
    ap.add_argument("--n-head", type=int, default=8, help="attention heads")
    ap.add_argument("--vocab", type=int, default=8192,
                    help="vocabulary (random tokens; 256 with --data)")
    ap.add_argument("--block", type=int, default=64, help="sequence length")
    ap.add_argument("--batch", type=int, default=4, help="sequences per step (one micro-batch)")
    ap.add_argument("--data", default="",
                    help="a text file whose bytes are the tokens; empty: random tokens")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where the model computes: cpu (DeepSpeed's CPU accelerator) or cuda "
                         "(its CUDA accelerator with NCCL; zo's parameters on the GPU); the "
                         "optimizers run on the CPU either way")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="fp32: fp32 weights and gradients; bf16: bf16 weights and gradients "
                         "with fp32 masters in the optimizer (the config's bf16 section)")
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW's learning rate (constant)")
    ap.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.999), help="AdamW's betas")
    ap.add_argument("--eps", type=float, default=1e-8, help="AdamW's eps")
    ap.add_argument("--weight-decay", type=float, default=0.01,
                    help="AdamW's decoupled weight decay")
    ap.add_argument("--clip", type=float, default=1.0,
                    help="gradient_clipping (global L2 norm; 0: off)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the init and the batches")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", 1)),
                    help="torch intra-op threads of each trainer, and OMP_NUM_THREADS for its "
                         "process (DeepSpeedCPUAdam's OpenMP threads); the default is "
                         "$OMP_NUM_THREADS, else 1")
    ap.add_argument("--server-threads", type=int, default=0,
                    help="zo-server --threads for zo-host (0: one per core, as the embedded "
                         "server has)")
    ap.add_argument("--only", choices=["both", "zo", "deepspeed"], default="both",
                    help="zo: the two zo trainers; deepspeed: DeepSpeed alone; both: all three "
                         "(each with the torch reference unless --no-torch)")
    ap.add_argument("--no-torch", action="store_true",
                    help="leave out the torch.optim.AdamW reference (compute alone; on the "
                         "CPU fp32 only, left out with --dtype bf16; on CUDA also bf16, its "
                         "AdamW then on the bf16 weights)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the trainers this many times, alternating; medians over all")
    ap.add_argument("--zo-server", default=os.path.join(ROOT, "build/release/bin/zo-server"),
                    help="the zo-server binary for zo-host")
    ap.add_argument("--zero-extra", default="{}",
                    help="JSON merged into the config's zero_optimization, e.g. "
                         "'{\"overlap_comm\": true}' (every trainer gets the same config; "
                         "zo warns about keys it does not run)")
    ap.add_argument("--keep", default="",
                    help="a directory to keep the trainers' logs and results in; empty: a "
                         "temporary one, removed")
    ap.add_argument("--json", action="store_true", help="print only the JSON row")
    ap.add_argument("--child", choices=TRAINERS, help=argparse.SUPPRESS)
    ap.add_argument("--child-dir", help=argparse.SUPPRESS)
    ap.add_argument("--servers", default="", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def train_config(args):
    """The one DeepSpeed-style config every trainer gets."""
    cfg = {"train_micro_batch_size_per_gpu": args.batch,
           "gradient_accumulation_steps": 1,
           "steps_per_print": 1_000_000,
           "optimizer": {"type": "AdamW",
                         "params": {"lr": args.lr, "betas": list(args.betas), "eps": args.eps,
                                    "weight_decay": args.weight_decay}},
           "zero_optimization": dict({"stage": 2, "offload_optimizer": {"device": "cpu"}},
                                     **json.loads(args.zero_extra))}
    if args.clip > 0:
        cfg["gradient_clipping"] = args.clip
    if args.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def gpt2_config(args):
    import transformers
    return transformers.GPT2Config(
        vocab_size=256 if args.data else args.vocab, n_positions=args.block,
        n_embd=args.n_embd, n_layer=args.n_layer, n_head=args.n_head,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)


def prepare(args, workdir):
    """Builds the model once and draws every batch; saves both for the trainers."""
    import torch
    import transformers
    torch.manual_seed(args.seed)
    cfg = gpt2_config(args)
    model = transformers.GPT2LMHeadModel(cfg)
    gen = torch.Generator().manual_seed(args.seed + 1)
    if args.data:
        with open(args.data, "rb") as f:
            text = torch.tensor(list(f.read()), dtype=torch.long)
        starts = torch.randint(0, len(text) - args.block, (args.steps, args.batch), generator=gen)
        batches = text[starts.unsqueeze(-1) + torch.arange(args.block)]
    else:
        batches = torch.randint(0, cfg.vocab_size, (args.steps, args.batch, args.block),
                                generator=gen)
    torch.save({"state": model.state_dict(), "batches": batches},
               os.path.join(workdir, "init.pt"))
    return sum(p.numel() for p in model.parameters())


def run_child(args):
    """One trainer: loads the saved init and batches, trains, writes its result."""
    import torch
    torch.set_num_threads(args.threads)
    import transformers
    saved = torch.load(os.path.join(args.child_dir, "init.pt"))
    model = transformers.GPT2LMHeadModel(gpt2_config(args))
    model.load_state_dict(saved["state"])
    device = torch.device(args.device)
    model = model.to(device)
    batches = saved["batches"]
    config = train_config(args)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    if args.device == "cuda":
        versions["gpu"] = torch.cuda.get_device_name()

    def now():
        # A step's parts end when the GPU's work for them ends.
        if args.device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    if args.child == "torch":
        if args.dtype == "bf16":
            model = model.to(torch.bfloat16)
        hp = config["optimizer"]["params"]
        optimizer = torch.optim.AdamW(model.parameters(), lr=hp["lr"], betas=hp["betas"],
                                      eps=hp["eps"], weight_decay=hp["weight_decay"])

        class TorchEngine:
            """engine(x), engine.backward(loss), engine.step() over torch.optim."""

            def __call__(self, *a, **k):
                return model(*a, **k)

            def backward(self, loss):
                loss.backward()

            def step(self):
                if args.clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=False)

        engine = TorchEngine()
    elif args.child == "deepspeed":
        import deepspeed
        versions["deepspeed"] = deepspeed.__version__
        if args.dtype == "bf16":
            model = model.to(torch.bfloat16)
        engine, optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=config)
        # What DeepSpeed made of the config, to show it is ZeRO-2 with its CPU Adam.
        versions["deepspeed_zero"] = (f"{type(optimizer).__name__} stage "
                                      f"{engine.zero_optimization_stage()} cpu_offload "
                                      f"{engine.zero_cpu_offload()}")
        versions["deepspeed_optimizer"] = type(
            getattr(optimizer, "optimizer", optimizer)).__name__
        versions["deepspeed_accelerator"] = deepspeed.get_accelerator()._name
        versions["deepspeed_comm"] = deepspeed.get_accelerator().communication_backend_name()
    else:
        import zo
        import zo.torch
        versions["zo"] = zo.__version__
        if args.dtype == "bf16":
            model = model.to(torch.bfloat16)
        servers = args.servers.split(",") if args.servers else None
        engine, optimizer, _, _ = zo.torch.initialize(model=model, config=config,
                                                      servers=servers)
    # Inside the step: DeepSpeed's CPU Adam call; zo's pushes (during
    # backward), the wait for the servers' step, the pull of the new weights.
    inner = {}
    if args.child == "deepspeed":
        timed(optimizer, "_optimizer_step", "adam_s", inner)
    elif args.child.startswith("zo"):
        timed(optimizer, "push_gradient", "push_s", inner)
        timed(optimizer, "_push_step", "finish_s", inner)
        timed(optimizer, "_load", "pull_s", inner)
    inner_s = {key: [] for key in inner}
    losses, fwd, bwd, opt, total = [], [], [], [], []
    for step in range(args.steps):
        for key in inner:
            inner[key] = 0.0
        x = batches[step].to(device)
        t0 = now()
        loss = engine(x, labels=x).loss
        t1 = now()
        engine.backward(loss)
        t2 = now()
        engine.step()
        t3 = now()
        losses.append(loss.item())
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
        opt.append(t3 - t2)
        total.append(t3 - t0)
        for key, value in inner.items():
            inner_s[key].append(value)
        print(f"{args.child} step {step + 1} loss {losses[-1]:.6f} {total[-1] * 1e3:.0f} ms",
              flush=True)
    if args.child.startswith("zo"):
        optimizer.close()
    result = {"losses": losses, "step_s": total, "forward_s": fwd, "backward_s": bwd,
              "opt_step_s": opt, "inner": inner_s, "versions": versions}
    with open(os.path.join(args.child_dir, f"{args.child}.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)


def timed(obj, method, key, totals):
    """Adds the time of each call of obj.method to totals[key]."""
    original = getattr(obj, method)
    totals[key] = 0.0

    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            totals[key] += time.perf_counter() - t0
    setattr(obj, method, wrapper)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def zo_server(binary, threads, log_path):
    """A zo-server on a free loopback port; yields its address."""
    log = open(log_path, "w", encoding="utf-8")
    p = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--threads", str(threads)],
                         stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stderr:  # the log line that names the bound port
            log.write(line)
            m = re.search(r"listening on 127\.0\.0\.1:0 \(port (\d+)\)", line)
            if m:
                address = f"127.0.0.1:{m.group(1)}"
                break
        else:
            raise RuntimeError(f"zo-server exited with {p.wait()} before listening")
        # Keep reading its log, so the server never blocks on a full pipe.
        threading.Thread(target=lambda: log.writelines(p.stderr), daemon=True).start()
        yield address
    finally:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def child_argv(args, trainer, workdir, servers=""):
    argv = [sys.executable, os.path.abspath(__file__), "--child", trainer, "--child-dir", workdir]
    for key in ("device", "steps", "n_layer", "n_embd", "n_head", "vocab", "block", "batch", "dtype",
                "lr", "eps", "weight_decay", "clip", "seed", "threads", "zero_extra"):
        argv += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    argv += ["--betas", *map(str, args.betas)]
    if args.data:
        argv += ["--data", args.data]
    if servers:
        argv += ["--servers", servers]
    return argv


def child_env(args, trainer):
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if trainer == "deepspeed":
        env.update(DS_ACCELERATOR=args.device, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                   LOCAL_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    else:
        # zo's job name must not come from a launcher's MASTER_ADDR/PORT.
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)
    return env


def run_trainer(args, trainer, workdir, round_):
    log_path = os.path.join(workdir, f"{trainer}-round{round_}.log")
    with contextlib.ExitStack() as stack:
        servers = ""
        if trainer == "zo-host":
            server_log = os.path.join(workdir, f"zo-server-round{round_}.log")
            servers = stack.enter_context(zo_server(args.zo_server, args.server_threads,
                                                    server_log))
        with open(log_path, "w", encoding="utf-8") as log:
            rc = subprocess.call(child_argv(args, trainer, workdir, servers),
                                 env=child_env(args, trainer), stdout=log,
                                 stderr=subprocess.STDOUT)
    if rc != 0:
        with open(log_path, encoding="utf-8") as f:
            tail = f.read()[-4000:]
        raise RuntimeError(f"{trainer} exited with {rc}; the end of {log_path}:\n{tail}")
    with open(os.path.join(workdir, f"{trainer}.json"), encoding="utf-8") as f:
        return json.load(f)


def median_after(runs, key, warmup):
    """The median of `key` over every round's steps after the first `warmup`."""
    values = [v for r in runs for v in (r[key][warmup:] if len(r[key]) > warmup else r[key])]
    return statistics.median(values)


def main():
    args = parse_args()
    if args.child:
        run_child(args)
        return 0
    if args.steps < 1 or args.rounds < 1:
        sys.exit("--steps and --rounds must be at least 1")
    trainers = {"both": TRAINERS[:3], "zo": TRAINERS[1:3], "deepspeed": TRAINERS[:1]}[args.only]
    if not args.no_torch and (args.dtype == "fp32" or args.device == "cuda"):
        trainers += ("torch",)
    load_start = os.getloadavg()
    runs = {t: [] for t in trainers}
    with contextlib.ExitStack() as stack:
        if args.keep:
            os.makedirs(args.keep, exist_ok=True)
            workdir = args.keep
        else:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="ds-beside-zo-"))
        params = prepare(args, workdir)
        for round_ in range(1, args.rounds + 1):
            for trainer in trainers:
                if not args.json:
                    print(f"round {round_}: training {trainer} ...", file=sys.stderr, flush=True)
                try:
                    runs[trainer].append(run_trainer(args, trainer, workdir, round_))
                except (RuntimeError, OSError) as e:
                    print(e, file=sys.stderr)
                    return 2
    load_end = os.getloadavg()

    # Relative loss gaps to DeepSpeed's, step by step, over every round.
    compared = [t for t in trainers if t != "deepspeed"] if "deepspeed" in trainers else []
    worst = {t: 0.0 for t in compared}
    for t in compared:
        for ref, run in zip(runs["deepspeed"], runs[t]):
            for a, b in zip(ref["losses"], run["losses"]):
                worst[t] = max(worst[t], abs(b - a) / abs(a))
    if not args.json:
        print("step  " + "  ".join(f"{t:>12}" for t in trainers)
              + "".join(f"  {'gap ' + t:>14}" for t in compared))
        for step in range(args.steps):
            losses = {t: runs[t][0]["losses"][step] for t in trainers}
            gaps = [abs(losses[t] - losses["deepspeed"]) / abs(losses["deepspeed"])
                    for t in compared]
            print(f"{step + 1:4d}  " + "  ".join(f"{losses[t]:12.6f}" for t in trainers)
                  + "".join(f"  {g:14.2e}" for g in gaps))

    summary = {"bench": "deepspeed_beside_zo", "device": args.device, "dtype": args.dtype, "steps": args.steps,
               "warmup": args.warmup, "rounds": args.rounds, "params": params,
               "n_layer": args.n_layer, "n_embd": args.n_embd,
               "vocab": 256 if args.data else args.vocab, "block": args.block,
               "batch": args.batch, "clip": args.clip, "threads": args.threads,
               "zero_optimization": train_config(args)["zero_optimization"],
               "cpus": os.cpu_count(), "loadavg_start": round(load_start[0], 2),
               "loadavg_end": round(load_end[0], 2)}
    for t in trainers:
        for key in ("step_s", "forward_s", "backward_s", "opt_step_s"):
            summary[f"{key}_{t}"] = round(median_after(runs[t], key, args.warmup), 4)
        summary[f"round_step_s_{t}"] = [round(median_after([r], "step_s", args.warmup), 4)
                                        for r in runs[t]]
        for key in runs[t][0]["inner"]:
            summary[f"{key}_{t}"] = round(median_after([r["inner"] for r in runs[t]], key,
                                                       args.warmup), 4)
        summary[f"last_loss_{t}"] = runs[t][0]["losses"][-1]
    if "torch" in trainers:
        # The model's compute alone: torch's forward and backward, no offload hooks.
        compute = summary["forward_s_torch"] + summary["backward_s_torch"]
        summary["compute_s"] = round(compute, 4)
        for t in trainers[:-1]:
            summary[f"overhead_s_{t}"] = round(summary[f"step_s_{t}"] - compute, 4)
    for t in compared:
        if t == "torch":
            continue
        name = t.replace("-", "_")
        summary[f"ratio_{name}_vs_deepspeed"] = round(
            summary[f"step_s_{t}"] / summary["step_s_deepspeed"], 3)
        if "torch" in trainers and summary["overhead_s_deepspeed"] > 0:
            summary[f"overhead_ratio_{name}_vs_deepspeed"] = round(
                summary[f"overhead_s_{t}"] / summary["overhead_s_deepspeed"], 3)
    for t in compared:
        summary[f"worst_rel_loss_gap_{t}"] = worst[t]
    versions = {}
    for t in trainers:
        versions.update(runs[t][0]["versions"])
    summary["versions"] = versions
    print(json.dumps(summary))
    limit = 1e-3 if args.dtype == "fp32" else 3e-2
    bad = {t: g for t, g in worst.items() if t != "torch" and g > limit}
    if bad:
        print(f"deepspeed_beside_zo: loss gaps {bad} beyond {limit} "
              f"(the tolerance for {args.dtype})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

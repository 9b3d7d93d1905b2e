"""A DeepSpeed-shaped training process for test_servers.py's kill test:
trains TiedLm with zo.torch.initialize against one server, one line per
finished step on stdout.

    python3 engine_worker.py SERVER CKPT_DIR STEPS [--save-at K] [--load] [--out FILE]
"""

import argparse

import torch

import zo.torch
from test_engine import ds_config
from test_offload_optimizer import batch, reference_and_model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("server")
    ap.add_argument("ckpt_dir")
    ap.add_argument("steps", type=int)
    ap.add_argument("--save-at", type=int, default=0)
    ap.add_argument("--load", action="store_true")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    model, _ = reference_and_model()
    engine, opt, _, _ = zo.torch.initialize(model=model, config=ds_config(1),
                                            servers=[a.server], job="killed")
    if a.load:
        engine.load_checkpoint(a.ckpt_dir)
    print(f"attached at {engine.global_steps}", flush=True)
    while engine.global_steps < a.steps:
        engine.backward(engine(batch(engine.global_steps + 1)))
        engine.step()
        if engine.global_steps == a.save_at:
            engine.save_checkpoint(a.ckpt_dir)
        print(f"step {engine.global_steps} done", flush=True)
    if a.out:
        torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, a.out)
    opt.close()


if __name__ == "__main__":
    main()

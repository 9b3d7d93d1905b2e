"""A plain OffloadOptimizer training process for test_servers.py's restart
test: trains TiedLm against one server up to STEPS, one line per finished
step on stdout. With --die-in-step K it pushes part of step K's gradients
and then kills itself (SIGKILL), as a worker lost mid-step would be.

    python3 restart_worker.py SERVERS STEPS [--die-in-step K] [--pause-after K] [--out FILE]
"""

import argparse
import os
import signal
import sys

import torch

import zo.torch
from test_offload_optimizer import batch, config, reference_and_model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("server", help="host:port[,host:port...]")
    ap.add_argument("steps", type=int)
    ap.add_argument("--die-in-step", type=int, default=0)
    ap.add_argument("--pause-after", type=int, default=0,
                    help="after step K print 'paused' and wait for a line on stdin")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    model, _ = reference_and_model()
    opt = zo.torch.OffloadOptimizer(model.named_parameters(), config=config(),
                                    servers=a.server.split(","), job="restarted", resume=True)
    print(f"attached at {opt.global_steps}", flush=True)
    while opt.global_steps < a.steps:
        step = opt.global_steps + 1
        model(batch(step)).backward()
        if step == a.die_in_step:
            # One tensor's gradient reaches the servers (finish_step waits for
            # their answer); the others never go out.
            opt.push_gradient(0, model.embed.weight.grad)
            opt._client.finish_step(step)
            os.kill(os.getpid(), signal.SIGKILL)
        opt.step()
        opt.zero_grad()
        print(f"step {opt.global_steps} done", flush=True)
        if opt.global_steps == a.pause_after:
            print("paused", flush=True)
            sys.stdin.readline()
    # Where the weights are: in the region of the server that serves them
    # (test_servers.py checks it after a move).
    places = opt._client.region_pull_places(opt._all)
    in_region = bool(places) and all(
        place is None or torch.frombuffer(place, dtype=p.dtype).data_ptr() == p.data_ptr()
        for p, place in zip(opt._params, places))
    print(f"weights in the region: {in_region}", flush=True)
    if a.out:
        torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, a.out)
    opt.close()


if __name__ == "__main__":
    main()

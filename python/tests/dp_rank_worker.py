"""One dp rank of test_servers.py's two-process run: trains TiedLm on its own
batches against the servers given and saves its final weights.

    python3 dp_rank_worker.py RANK SERVER OUT_FILE
"""

import sys

import torch

import zo.torch
from test_offload_optimizer import config, reference_and_model

STEPS = 5


def rank_batch(step, rank):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randint(0, 16, (4, 9), generator=g)


def dp_config():
    cfg = config()
    cfg["train_batch_size"] = 2
    cfg["train_micro_batch_size_per_gpu"] = 1
    return cfg


def main(rank, server, out):
    model, _ = reference_and_model()
    opt = zo.torch.OffloadOptimizer(model.named_parameters(), config=dp_config(),
                                    servers=[server], job="dp2", dp_rank=rank, dp_world_size=2)
    for step in range(1, STEPS + 1):
        model(rank_batch(step, rank)).backward()
        opt.step()
        opt.zero_grad()
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, out)
    opt.close()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])

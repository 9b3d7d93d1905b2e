"""A training script written for DeepSpeed, the way its tutorials shape
one, with a single change: `import zo.torch as deepspeed`. The servers come
from the command line (--zo_servers); everything else is DeepSpeed's API.

    python3 deepspeed_style_script.py --deepspeed --deepspeed_config ds.json \\
        --zo_servers HOST:PORT --steps N --save_dir DIR --out FILE
"""

import argparse

import torch

import zo.torch as deepspeed
from test_offload_optimizer import TiedLm


def main():
    parser = argparse.ArgumentParser(description="a DeepSpeed script")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--save_dir", default="")
    parser.add_argument("--out", default="")
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    deepspeed.init_distributed()
    torch.manual_seed(0)
    net = TiedLm()
    model_engine, optimizer, _, lr_scheduler = deepspeed.initialize(
        args=args, model=net, model_parameters=net.parameters(), dist_init_required=True)
    assert model_engine.zero_optimization_stage() == 2 and model_engine.fp16_enabled()

    generator = torch.Generator().manual_seed(1234 + model_engine.global_rank)
    while model_engine.global_steps < args.steps:
        tokens = torch.randint(0, 16, (model_engine.train_micro_batch_size_per_gpu(), 9),
                               generator=generator).to(model_engine.device)
        loss = model_engine(tokens)
        model_engine.backward(loss)
        model_engine.step()
        lr_scheduler.step()
        if model_engine.is_gradient_accumulation_boundary() and model_engine.global_rank == 0:
            print(f"step {model_engine.global_steps} loss {loss.item():.6f} "
                  f"lr {lr_scheduler.get_last_lr()[0]:.3e} "
                  f"applied {model_engine.was_step_applied()} "
                  f"grad_norm {model_engine.get_global_grad_norm():.4f} "
                  f"batch {model_engine.train_batch_size()}", flush=True)
    if args.save_dir:
        model_engine.save_checkpoint(args.save_dir, client_state={"step": model_engine.global_steps})
    if args.out:
        torch.save({n: p.detach().clone() for n, p in net.named_parameters()}, args.out)
    optimizer.close()


if __name__ == "__main__":
    main()

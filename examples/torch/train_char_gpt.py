"""A character-level GPT trained with zo's offload servers under PyTorch.

A small GPT in plain PyTorch (token and position embeddings, pre-LayerNorm
transformer blocks with causal self-attention and a GELU MLP, a final
LayerNorm and a head tied to the token embedding) learns to continue a text
file character by character. The training loop is DeepSpeed's: the model
goes through zo.torch.initialize(), and engine(x), engine.backward(loss) and
engine.step() drive it, while AdamW, the lr schedule, gradient clipping and
fp16 loss scaling run on zo's servers (an embedded one inside this process,
or the zo-server processes --servers names).

Run it from the repository root after building (any text file will do; the
vocabulary is the set of characters in it, the first 90% trains and the
last 10% validates):

    PYTHONPATH=build/release/python /usr/bin/python3 examples/torch/train_char_gpt.py \\
        --data input.txt

    # against running servers, in fp16, printing JSON lines:
    PYTHONPATH=build/release/python /usr/bin/python3 examples/torch/train_char_gpt.py \\
        --data input.txt --servers 10.0.0.5:7070,10.0.0.6:7070 --fp16 --json

Threads: torch picks its intra-op thread count itself (usually one per core);
set OMP_NUM_THREADS=N to bound it, e.g. on a machine shared with zo-server
or other jobs. The embedded server's threads come on top of torch's.

A zo-server keeps a job (named by --job) between runs. A second run against
the same servers and job name refuses to train until told what to do: --resume
goes on from the step and weights the servers hold, --load rolls the job back
to a checkpoint; give --job a new name to start afresh. The embedded server
lives and dies with the process.

Reproducibility: the model's initial weights come from --seed and batch k is
a function of (--seed, k) only, so a run that stops with --save and goes on
with --load takes the same steps as one that never stopped (same flags, same
thread count). That is also why the built-in config warms the lr up and then
holds it (WarmupLR) rather than decaying it over --steps: the schedule does
not change when --steps does.
"""

import argparse
import json
import math
import random
import sys
import time

import torch
import torch.nn.functional as F

import zo.torch

EVAL_BATCHES = 10  # batches per loss estimate (val every --eval-every steps, and at the end)
WARMUP_STEPS = 20


# ----------------------------------------------------------------------------- model


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, dim, heads, block_size):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        # True where a position may attend: itself and the ones before it.
        causal = torch.tril(torch.ones(block_size, block_size, dtype=torch.bool))
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, x):
        batch, time_len, dim = x.shape
        head_dim = dim // self.heads
        q, k, v = self.qkv(x).split(dim, dim=2)
        # (batch, heads, time, head_dim)
        q, k, v = (t.view(batch, time_len, self.heads, head_dim).transpose(1, 2)
                   for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)
        scores = scores.masked_fill(~self.causal[:time_len, :time_len], float("-inf"))
        mixed = torch.softmax(scores, dim=-1) @ v
        return self.proj(mixed.transpose(1, 2).reshape(batch, time_len, dim))


class Block(torch.nn.Module):
    def __init__(self, dim, heads, block_size):
        super().__init__()
        self.attn_norm = torch.nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, block_size)
        self.mlp_norm = torch.nn.LayerNorm(dim)
        self.mlp_in = torch.nn.Linear(dim, 4 * dim)
        self.mlp_out = torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(x))))


class CharGPT(torch.nn.Module):
    def __init__(self, vocab_size, block_size, layers, dim, heads):
        super().__init__()
        self.block_size = block_size
        self.token_embedding = torch.nn.Embedding(vocab_size, dim)
        self.position_embedding = torch.nn.Embedding(block_size, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads, block_size) for _ in range(layers))
        self.final_norm = torch.nn.LayerNorm(dim)
        self._init_weights(layers)

    def _init_weights(self, layers):
        # GPT-2's recipe: small normal weights, zero biases, and the layers that
        # write into the residual stream scaled down so its variance does not
        # grow with depth.
        for module in self.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        for block in self.blocks:
            for residual_writer in (block.attn.proj, block.mlp_out):
                torch.nn.init.normal_(residual_writer.weight, mean=0.0,
                                      std=0.02 / math.sqrt(2 * layers))

    def forward(self, tokens):
        """Logits (batch, time, vocab) for every next character."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        # The head is the token embedding itself (tied): one matrix, one entry
        # in zo's manifest.
        return F.linear(self.final_norm(x), self.token_embedding.weight)


def next_char_loss(model, inputs, targets):
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ----------------------------------------------------------------------------- data


def batch_generator(*key):
    """A torch generator seeded from `key` alone, so a batch never depends on
    what was drawn before it (resuming from a checkpoint draws the same ones)."""
    seed = random.Random(":".join(map(str, key))).getrandbits(63)
    return torch.Generator().manual_seed(seed)


def get_batch(data, batch_size, block_size, generator):
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    offsets = starts[:, None] + torch.arange(block_size)
    return data[offsets], data[offsets + 1]


@torch.no_grad()
def estimate_loss(model, data, batch_size, block_size, seed, split):
    """Mean loss over a fixed set of batches, the same at every call."""
    was_training = model.training
    model.eval()
    losses = [next_char_loss(model, *get_batch(data, batch_size, block_size,
                                               batch_generator("eval", split, seed, i))).item()
              for i in range(EVAL_BATCHES)]
    model.train(was_training)
    return sum(losses) / len(losses)


# ----------------------------------------------------------------------------- config


def built_in_config(batch_size):
    return {
        "train_micro_batch_size_per_gpu": batch_size,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW",
                      "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                 "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-3,
                                 "warmup_num_steps": WARMUP_STEPS, "warmup_type": "linear"}},
        "gradient_clipping": 1.0,
    }


def make_config(args):
    if args.config is None:
        config = built_in_config(args.batch_size or 32)
    else:
        with open(args.config, encoding="utf-8") as f:
            config = json.load(f)
        if args.batch_size is not None:
            # Let zo infer train_batch_size from the new micro batch.
            config["train_micro_batch_size_per_gpu"] = args.batch_size
            config.pop("train_batch_size", None)
        elif "train_micro_batch_size_per_gpu" not in config and "train_batch_size" not in config:
            config["train_micro_batch_size_per_gpu"] = 32
    if args.fp16:
        # The model stays fp32 here: zo pushes fp16 gradients, and the servers
        # keep fp32 master weights and run the dynamic loss scale.
        config["fp16"] = dict(config.get("fp16", {}), enabled=True)
        config.pop("bf16", None)
        config.pop("bfloat16", None)
    return config


# ----------------------------------------------------------------------------- main


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Train a character-level GPT on a text file with zo.torch.initialize "
                    "(optimizer, lr schedule, clipping and fp16 loss scaling on zo's servers).",
        epilog="Torch uses its default thread count; set OMP_NUM_THREADS to bound it.")
    parser.add_argument("--data", required=True, metavar="PATH",
                        help="a UTF-8 text file; its characters form the vocabulary, the first "
                             "90%% trains, the last 10%% validates")
    parser.add_argument("--servers", metavar="HOST:PORT,...",
                        help="zo-server addresses, comma-separated (default: an embedded server "
                             "in this process)")
    parser.add_argument("--job", default="char-gpt",
                        help="the job's name on the servers (default: char-gpt); a zo-server "
                             "keeps a job between runs: a later run with the same name needs "
                             "--resume (or --load); name a new job to start afresh")
    parser.add_argument("--resume", action="store_true",
                        help="go on with the job the servers hold under --job, from their step "
                             "and weights")
    parser.add_argument("--config", metavar="PATH",
                        help="a DeepSpeed-style JSON config (default: built in: AdamW lr 1e-3, "
                             "betas 0.9/0.95, weight decay 0.1, clipping 1.0, linear warmup over "
                             f"{WARMUP_STEPS} steps, then constant)")
    parser.add_argument("--steps", type=int, default=200,
                        help="train until the job has taken this many optimizer steps; after "
                             "--load that counts the checkpoint's steps (default: 200)")
    parser.add_argument("--batch-size", type=int,
                        help="sequences per micro-batch (default: the config's "
                             "train_micro_batch_size_per_gpu, 32 for the built-in config)")
    parser.add_argument("--block-size", type=int, default=64,
                        help="context length in characters (default: 64)")
    parser.add_argument("--layers", type=int, default=4, help="transformer blocks (default: 4)")
    parser.add_argument("--dim", type=int, default=128, help="embedding width (default: 128)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default: 4)")
    parser.add_argument("--seed", type=int, default=1337,
                        help="seeds the initial weights and every batch (default: 1337)")
    parser.add_argument("--eval-every", type=int, default=50, metavar="N",
                        help="print the validation loss every N steps, 0 never (default: 50)")
    parser.add_argument("--log-every", type=int, default=10, metavar="N",
                        help="print a progress line every N steps (default: 10)")
    parser.add_argument("--save", metavar="DIR",
                        help="engine.save_checkpoint(DIR) at the end (zo-server processes "
                             "write the checkpoint under their --checkpoint-dir; DIR records "
                             "where)")
    parser.add_argument("--load", metavar="DIR",
                        help="engine.load_checkpoint(DIR) at the start (the newest checkpoint "
                             "there) and go on from its step; same --data and model flags")
    parser.add_argument("--fp16", action="store_true",
                        help="set fp16.enabled in the config: fp16 gradients and dynamic loss "
                             "scaling on the servers (the model itself stays fp32)")
    parser.add_argument("--json", action="store_true",
                        help='print JSON lines instead of text: {"step", "loss", "lr", '
                             '"tokens_per_s"} per progress line (plus "loss_scale" with --fp16), '
                             '{"step", "val_loss"} per evaluation, and '
                             '{"final_train_loss", "final_val_loss"} at the end')
    args = parser.parse_args(argv)
    for name in ("steps", "block_size", "layers", "dim", "heads", "log_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.batch_size is not None and args.batch_size < 1:
        parser.error("--batch-size must be at least 1")
    if args.dim % args.heads:
        parser.error(f"--dim {args.dim} must be a multiple of --heads {args.heads}")
    if args.eval_every < 0:
        parser.error("--eval-every must be 0 or more")
    return args


def main(argv=None):
    args = parse_args(argv)
    emit = (lambda record: print(json.dumps(record), flush=True)) if args.json else None

    with open(args.data, encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    char_index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([char_index[c] for c in text], dtype=torch.long)
    split_at = int(0.9 * len(data))
    train_data, val_data = data[:split_at], data[split_at:]
    if len(val_data) <= args.block_size:
        sys.exit(f"{args.data}: {len(data)} characters are too few for --block-size "
                 f"{args.block_size} (the validation 10% needs more than that)")

    torch.manual_seed(args.seed)  # the initial weights; batches have their own generators
    model = CharGPT(len(chars), args.block_size, args.layers, args.dim, args.heads)
    config = make_config(args)
    servers = args.servers.split(",") if args.servers else None
    engine, optimizer, _, _ = zo.torch.initialize(model=model, config=config, servers=servers,
                                                  job=args.job, resume=args.resume)
    micro_batch = engine.train_micro_batch_size_per_gpu()
    accumulation = engine.gradient_accumulation_steps()
    # What a checkpoint must match: zo restores weights by name and shape only.
    run_shape = {"vocab": "".join(chars), "block_size": args.block_size,
                 "layers": args.layers, "dim": args.dim, "heads": args.heads}

    if args.load:
        path, client_state = engine.load_checkpoint(args.load)
        if path is None:
            sys.exit(f"--load {args.load}: no checkpoint there (no 'latest' file)")
        saved_shape = client_state.get("run_shape", {})
        if saved_shape != run_shape:
            sys.exit(f"--load {args.load}: saved for another text or model shape "
                     f"(vocabulary {len(saved_shape.get('vocab', ''))}, block size "
                     f"{saved_shape.get('block_size')}, layers {saved_shape.get('layers')}, "
                     f"dim {saved_shape.get('dim')}, heads {saved_shape.get('heads')})")
    if not args.json:
        params = sum(p.numel() for p in model.parameters())
        where = args.servers or "an embedded server"
        print(f"{len(text)} characters, vocabulary {len(chars)}, {params} parameters, "
              f"micro-batch {micro_batch} x {accumulation}, zo on {where}, "
              f"starting at step {engine.global_steps}", flush=True)

    tokens_per_step = micro_batch * accumulation * args.block_size
    window_start, window_steps = time.perf_counter(), 0
    model.train()
    for step in range(engine.global_steps + 1, args.steps + 1):
        step_loss = 0.0
        for micro in range(accumulation):
            inputs, targets = get_batch(train_data, micro_batch, args.block_size,
                                        batch_generator("train", args.seed, step, micro))
            loss = next_char_loss(engine, inputs, targets)
            engine.backward(loss)
            engine.step()
            step_loss += loss.item() / accumulation
        window_steps += 1

        if step % args.log_every == 0 or step == args.steps:
            elapsed = time.perf_counter() - window_start
            tokens_per_s = window_steps * tokens_per_step / elapsed
            lr = engine.get_lr()[0]
            if emit:
                record = {"step": step, "loss": step_loss, "lr": lr, "tokens_per_s": tokens_per_s}
                if args.fp16:
                    record["loss_scale"] = optimizer.loss_scale
                emit(record)
            else:
                scale = f"  loss scale {optimizer.loss_scale:g}" if args.fp16 else ""
                print(f"step {step:5d}  loss {step_loss:.4f}  lr {lr:.3e}  "
                      f"{tokens_per_s:8.0f} tokens/s{scale}", flush=True)
        if args.eval_every and step % args.eval_every == 0:
            val_loss = estimate_loss(model, val_data, micro_batch, args.block_size, args.seed,
                                     "val")
            if emit:
                emit({"step": step, "val_loss": val_loss})
            else:
                print(f"step {step:5d}  val loss {val_loss:.4f}", flush=True)
        if step % args.log_every == 0 or (args.eval_every and step % args.eval_every == 0):
            # Evaluation time stays out of tokens/s.
            window_start, window_steps = time.perf_counter(), 0

    if args.save:
        engine.save_checkpoint(args.save, client_state={"run_shape": run_shape})
    train_loss = estimate_loss(model, train_data, micro_batch, args.block_size, args.seed, "train")
    val_loss = estimate_loss(model, val_data, micro_batch, args.block_size, args.seed, "val")
    if emit:
        emit({"final_train_loss": train_loss, "final_val_loss": val_loss})
    else:
        print(f"final train loss {train_loss:.4f}  val loss {val_loss:.4f}  "
              f"(after {engine.global_steps} steps)", flush=True)
    optimizer.close()


if __name__ == "__main__":
    main()

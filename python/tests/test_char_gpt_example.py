"""examples/torch/train_char_gpt.py as a user runs it: a subprocess that
trains a small character-level GPT on an embedded zo server."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "torch" / "train_char_gpt.py"
TINY_SHAKESPEARE = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
# Small enough for a few seconds on two cores; still far below ln(vocab) at the end.
SMALL_MODEL = ["--layers", "2", "--dim", "64", "--heads", "4", "--block-size", "32",
               "--batch-size", "8", "--seed", "7"]
STEPS = 60


def run_example(*args):
    """Runs the example with --json; returns its JSON records."""
    done = subprocess.run([sys.executable, str(EXAMPLE), *args, "--json"],
                          env=dict(os.environ), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return [json.loads(line) for line in done.stdout.splitlines()]


def step_losses(records):
    return {r["step"]: r["loss"] for r in records if "loss" in r}


@pytest.fixture(scope="module")
def text_path(tmp_path_factory):
    if TINY_SHAKESPEARE.exists():
        return TINY_SHAKESPEARE
    # No shared data here: a generated text with a small vocabulary and
    # word-level structure, which the model learns as fast.
    words = ["the", "king", "shall", "speak", "of", "love", "and", "death", "my", "lord",
             "good", "night", "sweet", "prince", "to", "be", "or", "not", "what", "is"]
    rng = random.Random(0)
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 10))).capitalize() + "."
             for _ in range(6000)]
    path = tmp_path_factory.mktemp("text") / "generated.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def uninterrupted_run(text_path):
    return run_example("--data", str(text_path), *SMALL_MODEL, "--steps", str(STEPS),
                       "--log-every", "1")


def test_help_names_the_flags():
    done = subprocess.run([sys.executable, str(EXAMPLE), "--help"], env=dict(os.environ),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for flag in ("--data", "--servers", "--config", "--save", "--load", "--fp16", "--json"):
        assert flag in done.stdout


def test_the_loss_falls_well_below_its_start(uninterrupted_run):
    losses = step_losses(uninterrupted_run)
    assert sorted(losses) == list(range(1, STEPS + 1))
    # It starts near ln(vocabulary) (4.17 for tinyshakespeare's 65 characters)
    # and is about 1.1 lower after 60 steps; 0.5 leaves room for other texts.
    first = losses[1]
    last = sum(losses[s] for s in range(STEPS - 4, STEPS + 1)) / 5
    assert last < first - 0.5, (first, last)
    final = uninterrupted_run[-1]
    assert final["final_val_loss"] < first - 0.5, final
    progress = [r for r in uninterrupted_run if "loss" in r]
    assert all(r["tokens_per_s"] > 0 for r in progress)
    # The built-in schedule: a linear warmup from 0 over 20 steps, then 1e-3.
    assert progress[0]["lr"] == 0 and progress[-1]["lr"] == pytest.approx(1e-3)


def test_a_run_resumed_from_its_checkpoint_takes_the_same_steps(uninterrupted_run, text_path,
                                                                 tmp_path):
    checkpoints = tmp_path / "checkpoints"
    first_half = run_example("--data", str(text_path), *SMALL_MODEL, "--steps", str(STEPS // 2),
                             "--log-every", "1", "--save", str(checkpoints))
    assert (checkpoints / "latest").read_text() == f"global_step{STEPS // 2}"
    second_half = run_example("--data", str(text_path), *SMALL_MODEL, "--steps", str(STEPS),
                              "--log-every", "1", "--load", str(checkpoints))
    full = step_losses(uninterrupted_run)
    # Batch k depends on (seed, k) only and the checkpoint holds the weights,
    # moments and schedule position, so every loss agrees bit for bit.
    assert step_losses(first_half) == {s: full[s] for s in range(1, STEPS // 2 + 1)}
    assert step_losses(second_half) == {s: full[s] for s in range(STEPS // 2 + 1, STEPS + 1)}
    lrs = {r["step"]: r["lr"] for r in uninterrupted_run if "lr" in r}
    assert {r["step"]: r["lr"] for r in second_half if "lr" in r} == {
        s: lrs[s] for s in range(STEPS // 2 + 1, STEPS + 1)}
    assert second_half[-1] == uninterrupted_run[-1]  # the final train and val losses

"""zo.torch against real zo-server processes on loopback: striping over three
servers equals one, and two dp ranks in two processes average."""

import contextlib
import json
import copy
import os
import re
import socket
import subprocess
import sys
import threading

import pytest
import torch

import zo.torch
from dp_rank_worker import STEPS as DP_STEPS
from dp_rank_worker import rank_batch
from test_engine import ds_config
from test_offload_optimizer import LR, assert_same_weights, batch, config, reference_and_model

ZO_SERVER = os.environ.get("ZO_SERVER_PATH", "")
pytestmark = pytest.mark.skipif(not os.path.exists(ZO_SERVER),
                                reason="ZO_SERVER_PATH names no zo-server binary (ctest sets it)")


@contextlib.contextmanager
def zo_servers(n, *flags):
    """n zo-server processes on free loopback ports; yields their addresses."""
    procs, addresses = [], []
    try:
        for _ in range(n):
            p = subprocess.Popen([ZO_SERVER, "--listen", "127.0.0.1:0", "--threads", "1", *flags],
                                 stderr=subprocess.PIPE, text=True)
            procs.append(p)
            for line in p.stderr:  # the log line that names the bound port
                m = re.search(r"listening on 127\.0\.0\.1:0 \(port (\d+)\)", line)
                if m:
                    addresses.append(f"127.0.0.1:{m.group(1)}")
                    break
            else:
                raise RuntimeError(f"zo-server exited with {p.wait()} before listening")
            # Keep reading its log, so the server never blocks on a full pipe.
            threading.Thread(target=lambda s=p.stderr: all(True for _ in s), daemon=True).start()
        yield addresses
    finally:
        for p in procs:
            p.kill()
            p.wait()


def train(opt, model, steps):
    for step in range(1, steps + 1):
        model(batch(step)).backward()
        opt.step()
        opt.zero_grad()


def test_three_servers_train_exactly_as_one():
    # Without clipping the update is elementwise: striping changes no bit.
    one, _ = reference_and_model()
    three = copy.deepcopy(one)
    opt = zo.torch.OffloadOptimizer(one.named_parameters(), config=config())
    train(opt, one, 10)
    opt.close()
    with zo_servers(3) as addresses:
        cfg = config()
        cfg["zo"]["chunk_elems"] = 32  # small chunks, so every server holds some
        opt = zo.torch.OffloadOptimizer(three.named_parameters(), config=cfg,
                                        servers=addresses, job="three")
        train(opt, three, 10)
        opt.close()
    for (name, a), b in zip(one.named_parameters(), three.parameters()):
        assert torch.equal(a.detach(), b.detach()), name


def test_two_dp_ranks_in_two_processes_average_their_gradients(tmp_path):
    with zo_servers(1) as (address,):
        here = os.path.dirname(os.path.abspath(__file__))
        ranks = [subprocess.Popen([sys.executable, os.path.join(here, "dp_rank_worker.py"),
                                   str(r), address, str(tmp_path / f"rank{r}.pt")])
                 for r in range(2)]
        assert [p.wait(timeout=300) for p in ranks] == [0, 0]
    finals = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    # The reference: AdamW on the mean of both ranks' gradients.
    _, ref = reference_and_model()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.01)
    for step in range(1, DP_STEPS + 1):
        grads = []
        for rank in range(2):
            ref.zero_grad()
            ref(rank_batch(step, rank)).backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        for p, g0, g1 in zip(ref.parameters(), *grads):
            p.grad = (g0 + g1) / 2
        ref_opt.step()
    for r, final in enumerate(finals):
        model, _ = reference_and_model()
        model.load_state_dict(final)
        assert_same_weights(model, ref, f"rank {r}")
    assert all(torch.equal(finals[0][n], finals[1][n]) for n in finals[0])


def test_a_killed_worker_loads_its_checkpoint_and_repeats_the_trajectory(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    worker = [sys.executable, os.path.join(here, "engine_worker.py")]
    ckpt = str(tmp_path / "ckpt")
    # Uninterrupted: 6 steps.
    with zo_servers(1) as (address,):
        subprocess.run(worker + [address, ckpt, "6", "--out", str(tmp_path / "whole.pt")],
                       check=True, stdout=subprocess.DEVNULL, timeout=300)
    with zo_servers(1, "--checkpoint-dir", str(tmp_path / "server-ckpt")) as (address,):
        # Checkpoint at step 3, killed (SIGKILL) once step 5 is done: in step 6.
        p = subprocess.Popen(worker + [address, ckpt, "100", "--save-at", "3"],
                             stdout=subprocess.PIPE, text=True)
        for line in p.stdout:
            if line.strip() == "step 5 done":
                p.kill()
                break
        assert p.wait(timeout=300) == -9
        # A new process on the same job rolls it back to step 3 and goes on.
        out = subprocess.run(worker + [address, ckpt, "6", "--load", "--out",
                                       str(tmp_path / "resumed.pt")],
                             check=True, capture_output=True, text=True, timeout=300).stdout
        assert "attached at 3" in out and "step 4 done" in out
    whole, resumed = torch.load(tmp_path / "whole.pt"), torch.load(tmp_path / "resumed.pt")
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name


def test_a_worker_killed_mid_step_reattaches_and_continues(tmp_path):
    """No checkpoint: the restarted process attaches at the servers' version,
    re-sends the step its predecessor had begun pushing (the servers keep
    what they have and take the rest) and ends where an uninterrupted run
    ends, bit for bit."""
    here = os.path.dirname(os.path.abspath(__file__))
    worker = [sys.executable, os.path.join(here, "restart_worker.py")]
    with zo_servers(1) as (address,):
        subprocess.run(worker + [address, "6", "--out", str(tmp_path / "whole.pt")],
                       check=True, stdout=subprocess.DEVNULL, timeout=300)
    with zo_servers(2) as addresses:
        servers = ",".join(addresses)
        died = subprocess.run(worker + [servers, "6", "--die-in-step", "4"],
                              capture_output=True, text=True, timeout=300)
        assert died.returncode == -9 and "step 3 done" in died.stdout, died.stderr
        out = subprocess.run(worker + [servers, "6", "--out", str(tmp_path / "resumed.pt")],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert "attached at 3" in out.stdout and "step 4 done" in out.stdout
        # Its first step went through a client of its own (which re-sends only
        # what the servers lack); the weights live in the lasting one's region.
        assert "weights in the region: True" in out.stdout, out.stdout
    whole, resumed = torch.load(tmp_path / "whole.pt"), torch.load(tmp_path / "resumed.pt")
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name


def test_unreachable_servers_are_named():
    model, _ = reference_and_model()
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RuntimeError, match=f"127.0.0.1:{port}"):
        zo.torch.OffloadOptimizer(model.named_parameters(), config=config(),
                                  servers=[f"127.0.0.1:{port}"], job="nowhere")


def test_a_different_model_on_an_open_job_is_refused_naming_the_tensor():
    with zo_servers(1) as (address,):
        model, _ = reference_and_model()
        opt = zo.torch.OffloadOptimizer(model.named_parameters(), config=config(),
                                        servers=[address], job="shared")
        other = torch.nn.Sequential(torch.nn.Linear(8, 3))
        with pytest.raises(RuntimeError, match="manifest|tensor"):
            zo.torch.OffloadOptimizer(other.named_parameters(), config=config(),
                                      servers=[address], job="shared")
        opt.close()


def test_a_deepspeed_script_runs_with_zo_torch_imported_as_deepspeed(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    ds_config = tmp_path / "ds_config.json"
    ds_config.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": LR,
                                                     "warmup_num_steps": 4}},
        "fp16": {"enabled": True, "initial_scale_power": 8},
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}))
    with zo_servers(2, "--checkpoint-dir", str(tmp_path / "server-ckpt")) as addresses:
        out = subprocess.run(
            [sys.executable, os.path.join(here, "deepspeed_style_script.py"), "--deepspeed",
             "--deepspeed_config", str(ds_config), "--zo_servers", ",".join(addresses),
             "--steps", "6", "--save_dir", str(tmp_path / "ckpt")],
            capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert [int(r[1]) for r in rows] == [1, 2, 3, 4, 5, 6], out.stdout
    assert all(r[7] == "True" and float(r[9]) > 0 and r[11] == "8" for r in rows), out.stdout
    # The servers' schedule, as the script's scheduler reports it: warming up
    # from 0 to the config's lr over 4 steps.
    lrs = [float(r[5]) for r in rows]
    assert lrs[0] == 0 and lrs == sorted(lrs) and lrs[-1] == pytest.approx(LR), lrs
    assert (tmp_path / "ckpt" / "latest").read_text() == "global_step6"


ZO_CTL = os.environ.get("ZO_CTL_PATH", "")


@pytest.mark.skipif(not os.path.exists(ZO_CTL), reason="ZO_CTL_PATH names no zo-ctl (ctest sets it)")
def test_a_worker_follows_its_job_to_the_servers_it_was_rescaled_onto(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    worker = [sys.executable, os.path.join(here, "restart_worker.py")]
    with zo_servers(1) as (address,):
        subprocess.run(worker + [address, "8", "--out", str(tmp_path / "whole.pt")],
                       check=True, stdout=subprocess.DEVNULL, timeout=300)
    with zo_servers(3, "--checkpoint-dir", str(tmp_path / "ckpt")) as (a, b, c):
        p = subprocess.Popen(worker + [f"{a},{b}", "8", "--pause-after", "3", "--out",
                                       str(tmp_path / "moved.pt")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for line in p.stdout:
            if line.strip() == "paused":
                break
        moved = subprocess.run([ZO_CTL, "rescale", "--server", a, "--job", "restarted",
                                "--servers", f"{a},{b},{c}"],
                               capture_output=True, text=True, timeout=120)
        assert moved.returncode == 0, moved.stderr
        p.stdin.write("go on\n")
        p.stdin.flush()
        rest = p.stdout.read()
        assert p.wait(timeout=300) == 0
        assert "step 8 done" in rest, rest
        assert "weights in the region: True" in rest, "the weights stayed in the old region"
        status = subprocess.run([ZO_CTL, "status", "--server", c, "--job", "restarted"],
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0 and re.search(r"version +8 ", status.stdout), status.stdout
    whole, moved_run = torch.load(tmp_path / "whole.pt"), torch.load(tmp_path / "moved.pt")
    for name in whole:
        assert torch.equal(whole[name], moved_run[name]), name


def test_a_fresh_run_never_lands_on_another_runs_job():
    """The default job name is new per run; a job trained under an explicit
    name is continued only when asked, and a job at version 0 opened from
    other initial weights is refused: the fresh model's weights are never
    overwritten by someone else's."""
    with zo_servers(1) as (address,):
        model, _ = reference_and_model()
        first = zo.torch.OffloadOptimizer(model.named_parameters(), config=config(),
                                          servers=[address])
        assert first.job.startswith("zo-torch-")
        train(first, model, 2)
        again, _ = reference_and_model()  # the same script run again: same seed
        second = zo.torch.OffloadOptimizer(again.named_parameters(), config=config(),
                                           servers=[address])
        assert second.job != first.job and second.global_steps == 0
        second.close()

        model, _ = reference_and_model()
        named = zo.torch.OffloadOptimizer(model.named_parameters(), config=config(),
                                          servers=[address], job="kept")
        train(named, model, 3)
        trained = {n: p.detach().clone() for n, p in model.named_parameters()}
        fresh, _ = reference_and_model()
        start = {n: p.detach().clone() for n, p in fresh.named_parameters()}
        rerun = zo.torch.OffloadOptimizer(fresh.named_parameters(), config=config(),
                                          servers=[address], job="kept")
        for n, p in fresh.named_parameters():  # untouched: nothing was pulled into it
            assert torch.equal(p, start[n]), n
        fresh(batch(4)).backward()
        with pytest.raises(RuntimeError, match=r"job 'kept' on the servers has taken 3 steps, "
                                               r"started from the same initial weights"):
            rerun.step()
        assert named._client.job_status()["version"] == 3
        rerun.close()
        resumed = zo.torch.OffloadOptimizer(fresh.named_parameters(), config=config(),
                                            servers=[address], job="kept", resume=True)
        for n, p in fresh.named_parameters():  # the servers' weights: the job goes on
            assert torch.equal(p, trained[n]), n
        resumed.close()

        torch.manual_seed(5)
        other = copy.deepcopy(model)
        for p in other.parameters():
            p.data.normal_()
        zero = zo.torch.OffloadOptimizer(model.named_parameters(), config=config(),
                                         servers=[address], job="at-zero")
        with pytest.raises(RuntimeError, match="job at-zero was opened from other initial weights"):
            zo.torch.OffloadOptimizer(other.named_parameters(), config=config(),
                                      servers=[address], job="at-zero")
        zero.close()
        named.close()
        first.close()


@pytest.mark.parametrize("job,model,dpu", [("fp32", torch.float32, False),
                                           ("bf16", torch.float32, False),
                                           ("bf16", torch.bfloat16, False),
                                           ("bf16", torch.bfloat16, True)],
                         ids=["fp32", "bf16_over_fp32", "bf16", "bf16_dpu"])
def test_a_cpu_model_moves_into_the_region_and_trains_as_with_an_embedded_server(job, model, dpu):
    # On the same-host route the parameters of the job's dtype move, once,
    # into the shared region the server writes pulled weights to (an fp32
    # model's bf16 staging buffers are made there); every pull after that
    # writes them in place. The weights must be those of the embedded run,
    # bit for bit, and stay readable after the server and client are gone.
    embedded, initial = reference_and_model()
    embedded.to(model)
    initial.to(model)
    same_host = copy.deepcopy(embedded)
    cfg = config(dpu)
    if job == "bf16":
        cfg["bf16"] = {"enabled": True}
    opt = zo.torch.OffloadOptimizer(embedded.named_parameters(), config=cfg)
    train(opt, embedded, 10)
    opt.close()
    before = [p.data_ptr() for p in same_host.parameters()]
    with zo_servers(1) as (address,):
        opt = zo.torch.OffloadOptimizer(same_host.named_parameters(), config=cfg,
                                        servers=[address], job="region")
        moved = [p.data_ptr() for p in same_host.parameters()]
        if model == torch.float32 and job != "fp32":
            assert moved == before, "an fp32 parameter of a bf16 job moved"
        else:
            assert all(a != b for a, b in zip(before, moved)), "the parameters stayed put"
        train(opt, same_host, 10)
        assert [p.data_ptr() for p in same_host.parameters()] == moved, \
            "a pull wrote the weights somewhere else"
        opt.close()
    for (name, a), b in zip(embedded.named_parameters(), same_host.parameters()):
        assert torch.equal(a.detach(), b.detach()), name
    assert any(not torch.equal(a.detach(), b.detach())
               for a, b in zip(embedded.parameters(), initial.parameters())), "nothing trained"


@pytest.mark.parametrize("job,dpu", [("fp32", False), ("bf16", False), ("bf16", True)],
                         ids=["fp32", "bf16", "bf16_dpu"])
def test_the_engines_gradients_live_in_the_region_and_train_as_with_an_embedded_server(job, dpu):
    # The engine keeps .grad between steps (zeroed, not freed). On the
    # same-host route, with torch's post-accumulate hook, those buffers are
    # the server's places in the region's two gradient areas, the next
    # step's taken in turn after each step: backward sums two micro-batches
    # there and no push copies them. The weights must be the embedded run's
    # bit for bit, and the gradients stay readable once all is closed.
    dtype = torch.float32 if job == "fp32" else torch.bfloat16
    embedded, _ = reference_and_model()
    embedded.to(dtype)
    same_host = copy.deepcopy(embedded)
    cfg = ds_config(2)
    cfg["zo"] = {"dpu": {"enabled": dpu, "warmup_steps": 0}}
    if job == "bf16":
        cfg["bf16"] = {"enabled": True}

    def train_engine(model, servers):
        engine, opt, _, _ = zo.torch.initialize(model=model, config=cfg, servers=servers,
                                                job="engine-grads")
        places = []
        for step in range(1, 8):
            for m in range(2):
                engine.backward(engine(batch(10 * step + m)))
                engine.step()
            assert all(not p.grad.any() for p in model.parameters()), f"step {step}"
            places.append([p.grad.data_ptr() for p in model.parameters()])
        return opt, places

    opt, _ = train_engine(embedded, None)
    assert opt._client.region_push_places(opt.global_steps + 1, [0]) == [], \
        "the embedded server's own buffers were lent as region places"
    opt.close()
    with zo_servers(1) as (address,):
        opt, places = train_engine(same_host, [address])
        if opt._grads_in_region:
            assert places[0] != places[1] and places[2:] == (places[:2] * 3)[:len(places) - 2], \
                "the gradients did not take the two areas in turn"
            weights = [p.data_ptr() for p in same_host.parameters()]
            assert not set(weights) & set(places[0] + places[1])
        else:  # torch < 2.1: the engine pushes .grad + the new part from a buffer
            assert not hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
            assert all(p == places[0] for p in places)
        opt.close()
    for (name, a), b in zip(embedded.named_parameters(), same_host.parameters()):
        assert torch.equal(a.detach(), b.detach()), name
        assert not b.grad.any(), name  # readable with the client and server gone


@pytest.mark.parametrize("job,dpu,replaced", [("fp32", False, False), ("bf16", False, False),
                                              ("bf16", True, False), ("fp32", False, True)],
                         ids=["fp32", "bf16", "bf16_dpu", "fp32_replaced"])
def test_zero_grad_keeping_the_gradients_puts_them_in_the_region(job, dpu, replaced):
    # A loop that zeroes .grad instead of freeing it (zero_grad(set_to_none=
    # False)) gets, on the same-host route, gradients in the places the
    # server reads, the region's two areas in turn: backward sums two
    # micro-batches there and step() copies nothing. The weights must be
    # the embedded run's bit for bit (there .grad stays where it is), and,
    # for fp32, torch.optim.AdamW's run with the same loop. `replaced`: the
    # loop puts another tensor in .grad after backward (as DDP's
    # gradient_as_bucket_view does); step() copies it into the place, so
    # that it is still pushed from there.
    dtype = torch.float32 if job == "fp32" else torch.bfloat16
    embedded, ref = reference_and_model()
    embedded.to(dtype)
    same_host = copy.deepcopy(embedded)
    cfg = config(dpu)
    if job == "bf16":
        cfg["bf16"] = {"enabled": True}

    def train_keeping(model, opt, steps=7):
        places = []
        for step in range(1, steps + 1):
            for m in range(2):
                model(batch(10 * step + m)).backward()
            if replaced:
                for p in model.parameters():
                    p.grad = p.grad.clone()
            opt.step()
            opt.zero_grad(set_to_none=False)
            assert all(not p.grad.any() for p in model.parameters()), f"step {step}"
            places.append([p.grad.data_ptr() for p in model.parameters()])
        return places

    opt = zo.torch.OffloadOptimizer(embedded.named_parameters(), config=cfg)
    kept = train_keeping(embedded, opt)
    assert replaced or all(p == kept[0] for p in kept), "an embedded run's .grad moved"
    opt.close()
    with zo_servers(1) as (address,):
        opt = zo.torch.OffloadOptimizer(same_host.named_parameters(), config=cfg,
                                        servers=[address], job="kept-grads")
        places = train_keeping(same_host, opt)
        # Each step's gradients but the first's (made by backward, before
        # any zero_grad) were pushed from where the server reads them.
        traffic = opt._client.traffic()
        assert traffic["pushed_in_place_bytes"] == traffic["pushed_bytes"] * 6 // 7, traffic
        lent = opt._client.region_push_places(opt.global_steps + 1, opt._all)
        assert [torch.frombuffer(p, dtype=dtype).data_ptr() for p in lent] == places[-1], \
            "the gradients are not in the next step's places"
        assert places[0] != places[1] and places[2:] == (places[:2] * 4)[:len(places) - 2], \
            "the gradients did not take the two areas in turn"
        opt.close()
    for (name, a), b in zip(embedded.named_parameters(), same_host.parameters()):
        assert torch.equal(a.detach(), b.detach()), name
        assert not b.grad.any(), name  # readable with the client and server gone
    if job == "fp32" and not dpu:
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                    weight_decay=0.01)
        train_keeping(ref, ref_opt)
        assert_same_weights(same_host, ref, "zero_grad(set_to_none=False) against AdamW")


def test_the_engine_back_at_a_checkpoint_retakes_its_steps_with_its_gradients_in_the_region(
        tmp_path):
    # Back at step 2 from step 5, the gradients placed for step 6 leave the
    # region (the next step is 3, whose places are elsewhere) and are placed
    # again after it; the steps taken again are those taken the first time.
    model, _ = reference_and_model()
    with zo_servers(1, "--checkpoint-dir", str(tmp_path / "server-ckpt")) as (address,):
        engine, opt, _, _ = zo.torch.initialize(model=model, config=ds_config(1),
                                                servers=[address], job="engine-back")

        def train_engine(steps):
            for _ in range(steps):
                engine.backward(engine(batch(engine.global_steps + 1)))
                engine.step()

        train_engine(2)
        engine.save_checkpoint(str(tmp_path / "engine"))
        train_engine(3)
        after = [p.detach().clone() for p in model.parameters()]
        placed = {p.grad.data_ptr() for p in model.parameters()}
        engine.load_checkpoint(str(tmp_path / "engine"))
        assert engine.global_steps == 2
        if opt._grads_in_region:
            assert not placed & {p.grad.data_ptr() for p in model.parameters()}, \
                "a gradient stayed in the place of a step not taken next"
        train_engine(3)
        for (name, p), a in zip(model.named_parameters(), after):
            assert torch.equal(p.detach(), a), name
        if opt._grads_in_region:
            assert {p.grad.data_ptr() for p in model.parameters()} == placed
        opt.close()


def test_a_parameter_viewing_a_larger_buffer_stays_in_it():
    # A script that keeps its weights in one flat buffer reads them there:
    # such a parameter is not moved into the region, and its pulls copy.
    flat = torch.zeros(300)
    weight = torch.nn.Parameter(flat[:200].view(20, 10))
    bias = torch.nn.Parameter(torch.zeros(20))
    weight.grad, bias.grad = torch.ones(20, 10), torch.ones(20)
    with zo_servers(1) as (address,):
        opt = zo.torch.OffloadOptimizer([("weight", weight), ("bias", bias)], config=config(),
                                        servers=[address], job="views")
        at = weight.data_ptr()
        opt.step()
        assert weight.data_ptr() == at == flat.data_ptr()
        assert torch.equal(flat[:200], weight.detach().flatten()) and flat[0] != 0
        opt.close()

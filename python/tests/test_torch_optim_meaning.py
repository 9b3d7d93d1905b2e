"""What a torch.optim training loop says, OffloadOptimizer does: parameter
groups with their own weight decay, betas and eps; the lr a loop or a torch
lr_scheduler writes into param_groups, and so its betas, eps and weight decay
(OneCycleLR cycles betas[0]); frozen parameters left alone. Each
against torch.optim.AdamW given the same gradients and the same writes,
at the tolerances of test_offload_optimizer.py (rtol 2e-5, atol 1e-6), with
an embedded server and with two zo-server processes."""

import copy
import math

import pytest
import torch

import zo.torch
from test_offload_optimizer import assert_same_weights, batch, reference_and_model
from test_servers import ZO_SERVER, zo_servers

STEPS = 20


def plain_config(**extra):
    """AdamW whose defaults the groups override; no scheduler: the loop's lr."""
    cfg = {"train_batch_size": 1,
           "optimizer": {"type": "AdamW",
                         "params": {"lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8,
                                    "weight_decay": 0.0}}}
    cfg.update(extra)
    return cfg


def nanogpt_groups(model, named=False):
    """nanoGPT's configure_optimizers: decay matrices, not biases and norms."""
    decay = [(n, p) for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [(n, p) for n, p in model.named_parameters() if p.dim() < 2]
    pick = (lambda items: items) if named else (lambda items: [p for _, p in items])
    return [{"params": pick(decay), "weight_decay": 0.1},
            {"params": pick(no_decay), "weight_decay": 0.0, "betas": (0.8, 0.95), "eps": 1e-6}]


def cosine_lr(step, warmup=4, peak=2e-2, floor=1e-3):
    if step < warmup:
        return peak * (step + 1) / warmup
    ratio = (step - warmup) / (STEPS - warmup)
    return floor + 0.5 * (1 + math.cos(math.pi * ratio)) * (peak - floor)


def train_both(model, ref, opt, ref_opt, set_lr=None, schedulers=()):
    for step in range(1, STEPS + 1):
        if set_lr is not None:
            for o in (opt, ref_opt):
                for g in o.param_groups:
                    g["lr"] = set_lr(step)
        model(batch(step)).backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            if p.grad is not None:
                q.grad = p.grad.clone()
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
        for s in schedulers:
            s.step()


@pytest.fixture(params=["embedded", "two zo-server processes"])
def servers(request):
    if request.param == "embedded":
        yield None
        return
    if not ZO_SERVER:
        pytest.skip("ZO_SERVER_PATH names no zo-server binary (ctest sets it)")
    with zo_servers(2) as addresses:
        yield addresses


def test_nanogpt_groups_and_a_loop_that_sets_lr_each_iteration_match_adamw(servers):
    model, ref = reference_and_model()
    opt = zo.torch.OffloadOptimizer(nanogpt_groups(model), plain_config(), model=model,
                                    servers=servers, job="nanogpt")
    ref_opt = torch.optim.AdamW(nanogpt_groups(ref), lr=1e-2)
    train_both(model, ref, opt, ref_opt, set_lr=cosine_lr)
    assert_same_weights(model, ref, "nanoGPT's groups, cosine lr from the loop")
    # The loop's lr is what param_groups keeps showing: nothing overwrites it.
    assert [g["lr"] for g in opt.param_groups] == [cosine_lr(STEPS)] * 2
    opt.close()


def test_named_groups_and_a_torch_lr_scheduler_match_adamw(servers):
    model, ref = reference_and_model()
    opt = zo.torch.OffloadOptimizer(nanogpt_groups(model, named=True), plain_config(),
                                    servers=servers, job="scheduled")
    ref_opt = torch.optim.AdamW(nanogpt_groups(ref), lr=1e-2)
    lambdas = [lambda s: 0.9 ** s, lambda s: 1.0 / (1 + s)]  # one per group
    schedulers = [torch.optim.lr_scheduler.LambdaLR(opt, lambdas),
                  torch.optim.lr_scheduler.LambdaLR(ref_opt, lambdas)]
    train_both(model, ref, opt, ref_opt, schedulers=schedulers)
    assert_same_weights(model, ref, "a LambdaLR per group")
    assert [g["lr"] for g in opt.param_groups] == pytest.approx(
        [g["lr"] for g in ref_opt.param_groups], rel=0, abs=0)
    opt.close()


def test_a_one_cycle_schedule_cycling_betas_and_weight_decay_and_eps_written_later_match_adamw(
        servers):
    """OneCycleLR cycles betas[0] every step by default (cycle_momentum=True);
    a loop may also write weight_decay or eps between steps. torch.optim
    takes each step with what param_groups hold then; so do the servers,
    told with the step's rates. Two groups with their own values."""
    model, ref = reference_and_model()
    opt = zo.torch.OffloadOptimizer(nanogpt_groups(model), plain_config(), model=model,
                                    servers=servers, job="one-cycle")
    ref_opt = torch.optim.AdamW(nanogpt_groups(ref), lr=1e-2)
    schedulers = [torch.optim.lr_scheduler.OneCycleLR(o, max_lr=2e-2, total_steps=STEPS)
                  for o in (opt, ref_opt)]

    def write_later(step):
        if step == 8:
            for o in (opt, ref_opt):
                o.param_groups[0]["weight_decay"] = 0.05
                o.param_groups[1]["eps"] = 1e-4
        return 0  # no lr of its own: the schedulers' holds

    def train(steps):
        for step in steps:
            write_later(step)
            model(batch(step)).backward()
            for p, q in zip(model.parameters(), ref.parameters()):
                q.grad = p.grad.clone()
            for o in (opt, ref_opt):
                o.step()
                o.zero_grad()
            for sch in schedulers:
                sch.step()

    train(range(1, STEPS + 1))
    assert opt.param_groups[0]["betas"] != (0.9, 0.999), "the schedule cycled no betas"
    assert opt.param_groups[0]["betas"] == ref_opt.param_groups[0]["betas"]
    assert_same_weights(model, ref, "OneCycleLR cycling betas, weight decay and eps written")
    opt.close()


def test_betas_or_weight_decay_the_servers_cannot_take_per_step_are_refused_and_change_nothing():
    """With the config's scheduler the servers take no rates from the loop,
    and DPU compensation's terms assume the job's betas and weight decay: a
    write there is refused before anything is sent, naming why; so is one
    to a key zo runs only at its default, and a change made after backward
    sent the step."""
    model, _ = reference_and_model()
    scheduled = plain_config(scheduler={"type": "WarmupLR", "params": {
        "warmup_min_lr": 0.0, "warmup_max_lr": 1e-2, "warmup_num_steps": 5}})
    compensated = plain_config(zo={"dpu": {"enabled": True, "compensation": "worker"}})
    for cfg, why in ((scheduled, "the config's scheduler sets the job's rates on the servers"),
                     (compensated, "zo.dpu.compensation's terms take the job's own betas")):
        opt = zo.torch.OffloadOptimizer(model.named_parameters(), cfg)
        torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-2, total_steps=STEPS)
        if "scheduler" in cfg:  # OneCycleLR wrote an lr too, refused on its own
            opt.param_groups[0]["lr"] = opt._shown_lr[0]
        model(batch(1)).backward()
        with pytest.raises(RuntimeError, match=rf"param_groups\[0\]\['betas'\] was set to "
                                               rf"\(0.95, 0.999\), but the job opened with "
                                               rf"\(0.9, 0.999\) .*cycle_momentum=False.*{why}"):
            opt.step()
        assert opt._client.job_status()["version"] == 0
        opt.close()
        model.zero_grad()

    opt = zo.torch.OffloadOptimizer(nanogpt_groups(model), plain_config(), model=model)
    model(batch(1)).backward()
    opt.step()
    opt.zero_grad()
    after_one = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(batch(2)).backward()
    opt.param_groups[1]["maximize"] = True
    with pytest.raises(RuntimeError, match=r"param_groups\[1\]\['maximize'\] was set to "
                                           r"True: zo runs maximize=False only"):
        opt.step()
    del opt.param_groups[1]["maximize"]
    assert opt._client.job_status()["version"] == 1
    for n, p in model.named_parameters():
        assert torch.equal(p, after_one[n]), n
    opt.step()  # as opened again: taken
    assert opt._client.job_status()["version"] == 2
    opt.close()

    model.zero_grad()
    engine, opt, _, _ = zo.torch.initialize(model=model, config=plain_config())
    engine.backward(engine(batch(1)))  # sends step 1 with its betas
    opt.param_groups[0]["betas"] = (0.8, 0.999)
    with pytest.raises(RuntimeError, match=r"betas, eps or weight_decay changed after backward "
                                           r"sent step 1's gradients: set them before backward"):
        engine.step()
    opt.close()


def cpu_grad_scaler(**kwargs):
    if not hasattr(torch.amp, "GradScaler"):
        pytest.skip(f"torch {torch.__version__} has no CPU GradScaler (torch.amp.GradScaler)")
    return torch.amp.GradScaler("cpu", **kwargs)


def test_a_grad_scaler_over_an_fp16_job_is_refused_naming_both_scalers():
    """An fp16 job's loss scale is zo's: a GradScaler would unscale twice."""
    scaler = cpu_grad_scaler()
    model, _ = reference_and_model()
    opt = zo.torch.OffloadOptimizer(model.named_parameters(),
                                    plain_config(fp16={"enabled": True}))
    scaler.scale(model(batch(1))).backward()
    with pytest.raises(RuntimeError, match="a torch GradScaler is stepping this optimizer, but "
                                           "the job is fp16"):
        scaler.step(opt)
    assert opt._client.job_status()["version"] == 0
    assert not hasattr(opt, "found_inf")
    opt.close()


def test_a_grad_scaler_over_an_fp32_job_unscales_and_skips_as_with_adamw():
    """Without fp16 in the config, a GradScaler works as over torch.optim:
    it unscales before step() and skips the step on an inf."""
    model, ref = reference_and_model()
    opt = zo.torch.OffloadOptimizer(model.named_parameters(), plain_config())
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.0)
    scalers = [cpu_grad_scaler(init_scale=2.0 ** 10), cpu_grad_scaler(init_scale=2.0 ** 10)]
    for step in range(1, 7):
        for m, o, scaler in ((model, opt, scalers[0]), (ref, ref_opt, scalers[1])):
            scaler.scale(m(batch(step))).backward()
            if step == 3:  # an overflow: both scalers skip the step
                next(m.parameters()).grad[0] = math.inf
            scaler.step(o)
            scaler.update()
            o.zero_grad()
    assert opt._client.job_status()["version"] == 5
    assert scalers[0].get_scale() == scalers[1].get_scale()
    assert_same_weights(model, ref, "a GradScaler over an fp32 job")
    opt.close()


@pytest.mark.parametrize("job", ["fp32", "bf16 over fp32 parameters"])
def test_weights_loaded_into_the_model_after_the_optimizer_opened_are_refused_not_replaced(job):
    """torch.optim steps whatever the parameters hold; zo's servers hold the
    master weights, and a pull would replace weights loaded into the model
    since. Refused at the next step (and at an engine's first push), with
    the loaded weights and the job left as they are. A write of the values
    they already hold (DistributedDataParallel's broadcast, when the model
    is wrapped after the optimizer was built, as nanoGPT does) is not."""
    model, _ = reference_and_model()
    extra = {"bf16": {"enabled": True}} if job.startswith("bf16") else {}
    opt = zo.torch.OffloadOptimizer(model.named_parameters(), plain_config(**extra))
    model(batch(1)).backward()
    opt.step()
    opt.zero_grad()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.clone())  # bumps every version counter, changes nothing
    model(batch(2)).backward()
    opt.step()
    opt.zero_grad()
    assert opt._client.job_status()["version"] == 2
    torch.manual_seed(1)
    loaded = {n: t.clone() for n, t in type(model)().state_dict().items()}
    model.load_state_dict(loaded)
    model(batch(3)).backward()
    with pytest.raises(RuntimeError, match="parameter 'embed.weight' was written in place since "
                                           "zo last wrote it"):
        opt.step()
    assert opt._client.job_status()["version"] == 2
    for n, p in model.named_parameters():
        assert torch.equal(p, loaded[n]), n
    opt.close()

    cfg = dict(plain_config(**extra), train_batch_size=1, train_micro_batch_size_per_gpu=1)
    engine, _, _, _ = zo.torch.initialize(model=model, config=cfg)
    with torch.no_grad():
        model.norm.bias.add_(1.0)
    with pytest.raises(RuntimeError, match="parameter 'norm.bias' was written in place"):
        engine.backward(engine(batch(4)))
    engine.optimizer.close()


def test_a_zero_lr_group_does_not_move_and_the_other_does():
    model, ref = reference_and_model()
    groups = nanogpt_groups(model)
    groups[1]["lr"] = 0.0
    groups[1]["weight_decay"] = 0.5  # decay is lr * wd: nothing either
    opt = zo.torch.OffloadOptimizer(groups, plain_config(), model=model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for step in range(1, 6):
        model(batch(step)).backward()
        opt.step()
        opt.zero_grad()
    for n, p in model.named_parameters():
        if p.dim() < 2:
            assert torch.equal(p, before[n]), n
        else:
            assert not torch.equal(p, before[n]), n
    opt.close()


def test_frozen_parameters_are_not_in_the_job_and_never_move(servers):
    model, ref = reference_and_model()
    model.embed.weight.requires_grad_(False)
    ref.embed.weight.requires_grad_(False)
    # A frozen integer parameter is fine: it is never trained.
    for m in (model, ref):
        m.steps_seen = torch.nn.Parameter(torch.arange(3), requires_grad=False)
    frozen = model.embed.weight.detach().clone()
    cfg = dict(plain_config(),
               optimizer={"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}})
    opt = zo.torch.OffloadOptimizer(model.named_parameters(), cfg, servers=servers, job="frozen")
    assert "embed.weight" not in opt._names and "steps_seen" not in opt._names
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    train_both(model, ref, opt, ref_opt)
    assert torch.equal(model.embed.weight, frozen)
    assert torch.equal(model.steps_seen, torch.arange(3))
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=2e-5, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")
    opt.close()


def test_a_frozen_parameter_unfrozen_later_is_refused_naming_it():
    model, _ = reference_and_model()
    model.norm.weight.requires_grad_(False)
    opt = zo.torch.OffloadOptimizer(model.named_parameters(), plain_config())
    model(batch(1)).backward()
    opt.step()
    model.norm.weight.requires_grad_(True)
    with pytest.raises(RuntimeError, match="parameter 'norm.weight' was frozen"):
        opt.step()
    assert opt._client.job_status()["version"] == 1
    opt.close()


def test_add_param_group_after_the_job_opened_is_refused_saying_why():
    model, _ = reference_and_model()
    opt = zo.torch.OffloadOptimizer(model.named_parameters(), plain_config())
    with pytest.raises(NotImplementedError, match="add_param_group: a zo job's tensors are fixed"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    assert len(opt.param_groups) == 1
    opt.close()


def test_group_keys_zo_cannot_run_are_named():
    model, _ = reference_and_model()
    groups = nanogpt_groups(model)
    groups[1]["amsgrad"] = True
    with pytest.raises(NotImplementedError, match="parameter group 1: amsgrad=True"):
        zo.torch.OffloadOptimizer(groups, plain_config(), model=model)
    groups[1].pop("amsgrad")
    groups[0]["momentum"] = 0.9
    with pytest.raises(ValueError, match="parameter group 0: unknown key 'momentum'"):
        zo.torch.OffloadOptimizer(groups, plain_config(), model=model)


def test_bare_tensors_without_a_model_to_name_them_are_refused():
    model, _ = reference_and_model()
    with pytest.raises(TypeError, match="model= to name them"):
        zo.torch.OffloadOptimizer(nanogpt_groups(model), plain_config())


def test_with_the_configs_scheduler_a_loop_writing_lr_is_refused():
    model, _ = reference_and_model()
    cfg = plain_config(scheduler={"type": "WarmupLR",
                                  "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-2,
                                             "warmup_num_steps": 5, "warmup_type": "linear"}})
    opt = zo.torch.OffloadOptimizer(model.named_parameters(), cfg)
    for step in range(1, 4):
        model(batch(step)).backward()
        opt.step()
        opt.zero_grad()
    # The servers' schedule is what param_groups shows (DeepSpeed's WarmupLR
    # gives its first two steps the minimum).
    assert opt.param_groups[0]["lr"] == pytest.approx(2e-3)
    model(batch(4)).backward()
    opt.param_groups[0]["lr"] = 5e-3
    with pytest.raises(RuntimeError, match=r"param_groups\[0\]\['lr'\] was set to 0.005, but the "
                                           "config's scheduler"):
        opt.step()
    assert opt._client.job_status()["version"] == 3
    opt.close()
    groups = nanogpt_groups(model)
    groups[0]["lr"] = 3e-3
    with pytest.raises(ValueError, match="parameter group 0 sets lr 0.003 while the config's "
                                         "scheduler"):
        zo.torch.OffloadOptimizer(groups, cfg, model=model)


def test_a_negative_lr_is_named_and_the_step_is_not_taken():
    model, _ = reference_and_model()
    opt = zo.torch.OffloadOptimizer(model.named_parameters(), plain_config())
    opt.param_groups[0]["lr"] = -1.0
    model(batch(1)).backward()
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['lr'\] is -1.0"):
        opt.step()
    opt.param_groups[0]["lr"] = 1e-2
    opt.step()
    assert opt.global_steps == 1
    opt.close()


def test_servers_given_as_one_string_are_split_at_commas():
    if not ZO_SERVER:
        pytest.skip("ZO_SERVER_PATH names no zo-server binary (ctest sets it)")
    model, ref = reference_and_model()
    with zo_servers(2) as addresses:
        opt = zo.torch.OffloadOptimizer(model.named_parameters(), plain_config(),
                                        servers=",".join(addresses), job="one-string")
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.0)
        train_both(model, ref, opt, ref_opt)
        assert_same_weights(model, ref, "servers as 'a,b'")
        opt.close()


def test_engine_with_groups_and_a_torch_scheduler_matches_adamw():
    model, ref = reference_and_model()
    cfg = dict(plain_config(), train_batch_size=2, train_micro_batch_size_per_gpu=1)
    engine, opt, _, sched = zo.torch.initialize(
        model=model, config=cfg, model_parameters=nanogpt_groups(model),
        lr_scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5))
    ref_opt = torch.optim.AdamW(nanogpt_groups(ref), lr=1e-2)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=3, gamma=0.5)
    for step in range(1, 9):
        for micro in range(2):
            engine.backward(engine(batch(10 * step + micro)))
            engine.step()
        # The reference: the same two micro-batches, averaged.
        (ref(batch(10 * step)) / 2 + ref(batch(10 * step + 1)) / 2).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_sched.step()
    assert engine.global_steps == 8
    assert sched.get_last_lr() == ref_sched.get_last_lr()
    assert_same_weights(model, ref, "engine, groups, StepLR")
    opt.close()


def test_engine_gradients_stay_in_buffers_allocated_once():
    model, _ = reference_and_model()
    engine, opt, _, _ = zo.torch.initialize(model=model, config=plain_config())
    engine.backward(engine(batch(1)))
    engine.step()
    grads = [p.grad.data_ptr() for p in model.parameters()]
    for step in range(2, 6):
        engine.backward(engine(batch(step)))
        engine.step()
    assert [p.grad.data_ptr() for p in model.parameters()] == grads
    opt.close()


class BatchNormNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.bn = torch.nn.BatchNorm1d(6)
        self.frozen = torch.nn.Linear(6, 6)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.frozen(self.bn(self.lin(x))).square().mean()


def test_checkpoints_carry_buffers_frozen_parameters_and_client_state(tmp_path):
    torch.manual_seed(3)
    model = BatchNormNet()
    engine, opt, _, _ = zo.torch.initialize(model=model, config=plain_config())
    x = torch.randn(8, 6)
    for _ in range(3):
        engine.backward(engine(x))
        engine.step()
    state = {"epoch": 4, "rng": torch.get_rng_state(), "loss": torch.tensor([1.5, 2.5])}
    engine.save_checkpoint(str(tmp_path), client_state=state)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    for _ in range(2):  # moves the weights and the running statistics on
        engine.backward(engine(x * 2))
        engine.step()
    assert not torch.equal(model.bn.running_mean, saved["bn.running_mean"])
    opt.close()

    torch.manual_seed(99)  # a fresh model: other weights, other buffers
    fresh = BatchNormNet()
    engine2, opt2, _, _ = zo.torch.initialize(model=fresh, config=plain_config())
    _, client_state = engine2.load_checkpoint(str(tmp_path))
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, saved[k]), k
    assert client_state["epoch"] == 4 and torch.equal(client_state["rng"], state["rng"])
    assert torch.equal(client_state["loss"], state["loss"])
    assert engine2.global_steps == 3
    opt2.close()


def test_deepspeed_names_zo_lacks_say_so():
    import zo.torch as deepspeed
    with pytest.raises(NotImplementedError, match="deepspeed.zero .* is not in zo"):
        deepspeed.zero.Init()
    with pytest.raises(NotImplementedError, match="deepspeed.comm is not in zo"):
        deepspeed.comm.get_rank()
    assert not hasattr(deepspeed, "zero")  # still an AttributeError for hasattr
    model, _ = reference_and_model()
    engine, opt, _, _ = deepspeed.initialize(model=model, config=plain_config())
    with pytest.raises(NotImplementedError, match="engine.no_sync: zo's engine never all-reduces"):
        with engine.no_sync():
            pass
    opt.close()

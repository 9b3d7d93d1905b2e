"""zo.torch refuses what it cannot train with an exception that names the
parameter, the key or the server, and leaves the job as it was."""

import pytest
import torch

import zo.torch
from test_engine import ds_config
from test_offload_optimizer import batch, config, reference_and_model


def open_optimizer(named, cfg=None):
    return zo.torch.OffloadOptimizer(named, config=cfg or config())


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64])
def test_a_trainable_parameter_of_another_dtype_is_named(dtype):
    with pytest.raises(TypeError, match=f"parameter 'w' is {dtype}"):
        open_optimizer([("w", torch.nn.Parameter(torch.zeros(3, dtype=dtype)))])


def test_a_frozen_parameter_of_any_dtype_is_left_out_of_the_job():
    model, _ = reference_and_model()
    named = list(model.named_parameters()) + [("count", torch.nn.Parameter(
        torch.zeros(3, dtype=torch.int64), requires_grad=False))]
    opt = open_optimizer(named)
    assert "count" not in opt._names
    opt.close()


def test_a_non_contiguous_parameter_is_named():
    w = torch.nn.Parameter(torch.zeros(4, 3).t())
    with pytest.raises(ValueError, match="parameter 'w' is not contiguous"):
        open_optimizer([("ok", torch.nn.Parameter(torch.zeros(2))), ("w", w)])


def test_parameters_without_names_are_refused():
    model, _ = reference_and_model()
    with pytest.raises(TypeError, match="named_parameters"):
        open_optimizer(model.parameters())


def test_an_unknown_config_key_warns_naming_it():
    model, _ = reference_and_model()
    cfg = dict(config(), zero_allow_untested_optimiser=True, not_a_deepspeed_key=3)
    with pytest.warns(UserWarning, match="not_a_deepspeed_key"):
        opt = open_optimizer(model.named_parameters(), cfg)
    opt.close()


def test_a_parameter_resized_after_the_job_opened_is_named_and_nothing_is_pushed():
    model, _ = reference_and_model()
    opt = open_optimizer(model.named_parameters())
    model(batch(1)).backward()
    opt.step()
    kept = model.mix.bias.data
    model.mix.bias.data = torch.zeros(5)
    with pytest.raises(RuntimeError, match=r"parameter 'mix.bias' changed .* \[8\].* \[5\]"):
        opt.step()
    assert opt.global_steps == 1 and opt._client.job_status()["version"] == 1
    model.mix.bias.data = kept  # put back, the job trains on
    opt.zero_grad()
    model(batch(2)).backward()
    opt.step()
    assert opt.global_steps == 2
    opt.close()


def test_a_sparse_gradient_is_named_and_nothing_is_pushed():
    emb = torch.nn.Embedding(10, 4, sparse=True)
    cfg = dict(config(), bf16={"enabled": True})
    opt = open_optimizer(emb.named_parameters(), cfg)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="parameter 'weight' has a torch.sparse_coo gradient"):
        opt.step()
    assert opt._client.job_status()["version"] == 0
    opt.close()


def test_a_module_replaced_after_initialize_is_named():
    model, _ = reference_and_model()
    engine, opt, _, _ = zo.torch.initialize(model=model, config=ds_config(1))
    engine.backward(engine(batch(1)))
    engine.step()
    model.mix = torch.nn.Linear(8, 8)
    with pytest.raises(RuntimeError, match=r"replaced \['mix.bias', 'mix.weight'\]"):
        engine.backward(engine(batch(2)))
    model.extra = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match=r"added \['extra.bias', 'extra.weight'\]"):
        engine.backward(engine(batch(2)))
    assert engine.global_steps == 1
    opt.close()


def test_an_optimizer_used_after_close_says_so():
    model, _ = reference_and_model()
    opt = open_optimizer(model.named_parameters())
    opt.close()
    model(batch(1)).backward()
    with pytest.raises(RuntimeError, match="closed"):
        opt.step()

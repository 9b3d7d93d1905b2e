"""zo._native.widen: a 16-bit job's weights into fp32 parameters (zo.torch's
step for an fp32 model with bf16 or fp16 in the config). Every element must
be torch's own widening, bit for bit, whatever the value, across tensors of
many sizes; a pair that does not fit is refused naming it, before anything
is written."""

import pytest
import torch

from zo import _native

SIZES = [1, 7, 65536, 65537, 300001, 0]


def special(dtype):
    info = torch.finfo(dtype)
    return torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), info.max,
                         -info.max, info.tiny, info.tiny / 4, 1.0, -3.5], dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_widening_is_torchs_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(1)
    sources = [(torch.randn(n, generator=g) * 100).to(dtype) for n in SIZES]
    sources.append(special(dtype))
    destinations = [torch.full((s.numel(),), 7.0) for s in sources]
    _native.widen(sources, destinations)
    for i, (s, d) in enumerate(zip(sources, destinations)):
        assert torch.equal(d.view(torch.int32), s.to(torch.float32).view(torch.int32)), \
            f"tensor {i} ({s.numel()} elements)"


def test_a_pair_that_does_not_fit_is_named_and_nothing_is_written():
    good = (torch.ones(10, dtype=torch.bfloat16), torch.zeros(10))
    cases = [
        ((torch.ones(10, dtype=torch.bfloat16), torch.zeros(11)), "11"),
        ((torch.ones(10), torch.zeros(10)), "torch.float32, not torch.bfloat16"),
        ((torch.ones(10, dtype=torch.bfloat16), torch.zeros(10, dtype=torch.float64)),
         "torch.float64, not torch.float32"),
        ((torch.ones(10, dtype=torch.bfloat16), torch.zeros(20)[::2]), "not a contiguous"),
    ]
    for (src, dst), message in cases:
        with pytest.raises(ValueError, match=f"pair 1: .*{message}"):
            _native.widen([good[0], src], [good[1], dst])
        assert torch.equal(good[1], torch.zeros(10)), "the good pair was written"
    with pytest.raises(ValueError, match="2 sources for 1 destinations"):
        _native.widen([good[0], good[0]], [good[1]])
    with pytest.raises(TypeError, match="not a torch tensor"):
        _native.widen([[1.0]], [good[1]])

"""The out_scale value check of the quantizing ops (oasr_ops/families/scaled_mm/out_scale.py): bad values raise a
ValueError naming the op, a scale is read once per (base buffer, version, view), and a modified buffer is read
again. Reads are counted with a dispatch mode (the aten ops the check runs), not mocked."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from oasr_ops.families.scaled_mm.out_scale import check_out_scale


class CountGt(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.gt.Scalar:  # the check's `out_scale > 0`
            self.n += 1
        return func(*args, **(kwargs or {}))


def reads(fn) -> int:
    with CountGt() as c:
        fn()
    return c.n


def test_a_fresh_view_of_a_checked_buffer_is_not_read_again():
    scales = torch.rand(65) + 0.5        # a QuantLinear-like buffer: N weight scales, then the input scale
    assert reads(lambda: check_out_scale(scales[64:])) == 1
    # a compiled graph passes a new view object on every call: same base, version, pointer -> no read
    assert reads(lambda: check_out_scale(scales[64:])) == 0
    assert reads(lambda: check_out_scale(scales.as_strided((1,), (1,), 64))) == 0
    # another view of the same base is its own entry
    assert reads(lambda: check_out_scale(scales[:8])) == 1


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_an_in_place_change_is_read_again_and_rejected(bad):
    scales = torch.rand(9) + 0.5
    check_out_scale(scales[8:], op="scaled_mm_fp8_quant")
    scales[8] = bad                      # through the base: bumps the shared version counter
    with pytest.raises(ValueError, match=r"oasr\.scaled_mm_fp8_quant: out_scale must be finite and > 0"):
        check_out_scale(scales[8:], op="scaled_mm_fp8_quant")
    view = scales[8:]
    view.fill_(2.0)                      # through a view: the same counter
    check_out_scale(scales[8:])
    view.fill_(bad)
    with pytest.raises(ValueError, match="out_scale must be finite and > 0"):
        check_out_scale(scales[8:])


def test_bad_values_raise_every_time_and_good_plain_tensors_are_cached():
    bad = torch.tensor([1.0, 0.0])
    for _ in range(2):
        with pytest.raises(ValueError, match=r"got \[1\.0, 0\.0\]"):
            check_out_scale(bad)
    good = torch.tensor([0.25])
    assert reads(lambda: check_out_scale(good)) == 1
    assert reads(lambda: check_out_scale(good)) == 0


def test_inference_mode_tensors_are_read_on_every_call():
    with torch.inference_mode():
        s = torch.tensor([0.5])
        assert reads(lambda: check_out_scale(s)) == 1
        assert reads(lambda: check_out_scale(s)) == 1


def test_a_compiled_graphs_alias_of_a_checked_buffer_is_not_read_again():
    # Inductor passes `reinterpret_tensor(buffer, ...)` on every call of a graph without CUDA graphs: an alias with
    # no _base and its own version counter. It is keyed by the storage, so only the first call reads it.
    from torch._C._dynamo.guards import _reinterpret_tensor

    scales = torch.rand(65) + 0.5
    alias = lambda: _reinterpret_tensor(scales, (1,), (1,), 64)  # noqa: E731
    assert alias()._base is None
    assert reads(lambda: check_out_scale(alias())) == 1
    assert reads(lambda: check_out_scale(alias())) == 0
    assert reads(lambda: check_out_scale(_reinterpret_tensor(scales, (8,), (1,), 0))) == 1  # another view: read
    bad = torch.rand(2) + 0.5
    bad[1] = 0.0
    with pytest.raises(ValueError, match="out_scale must be finite and > 0"):
        check_out_scale(_reinterpret_tensor(bad, (1,), (1,), 1))


def test_a_plain_tensor_changed_in_place_is_read_again():
    s = torch.tensor([0.5])
    check_out_scale(s)
    s.fill_(float("nan"))
    with pytest.raises(ValueError, match="out_scale must be finite and > 0"):
        check_out_scale(s)

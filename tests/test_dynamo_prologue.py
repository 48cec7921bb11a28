"""benchmarks/dynamo_prologue.py's measurement runs on the CPU: a compiled call's graph inputs are counted and its
guard check is re-run on the frame's own arguments (the benchmark raises if they do not pass: the number would be
of a failing check). Timings are printed by the benchmark, never asserted."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import oasr_ops

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "dynamo_prologue.py"


@pytest.fixture()
def prologue(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the benchmark prepends "." when imported
    spec = importlib.util.spec_from_file_location("dynamo_prologue", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    torch._dynamo.reset()


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(32, 64), nn.Linear(64, 16)

    def forward(self, x, mask=None):  # a defaulted argument: the guard check gets every frame local
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("dict_tags", [False, True])
def test_host_us_counts_inputs_and_rechecks_the_guards(prologue, dict_tags):
    x = (torch.randn(4, 32),)
    with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=dict_tags):
        n, _host, _guards = prologue.host_us(TwoLayers().eval(), x, calls=3)
        assert n == 5  # x + two weights + two biases
        q = oasr_ops.quantize_(TwoLayers().eval(), "int8_w8a8")
        oasr_ops.calibrate(q, [x])
        n, _host, _guards = prologue.host_us(q, x, calls=3)
        assert n == 7  # x + (int8 weight, scales, bias) per layer

"""Helpers shared by the graph-pass tests (test_fuse_quant, test_fp8_fuse_quant, test_fuse_residual)."""
from __future__ import annotations

import copy

import pytest
import torch


class Capture:
    """A user post-grad pass (the backend chains it after its own): keeps the graph Inductor lowers."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.Graph] = []

    def __call__(self, graph):
        self.graphs.append(copy.deepcopy(graph))

    def uuid(self):
        return None  # bypass the caches: the pass must run


@pytest.fixture
def fresh_inductor(monkeypatch, tmp_path):
    """An Inductor cache of the test's own and a reset compiler before and after: every compile runs the passes."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch.compiler.reset()
    yield
    torch.compiler.reset()

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


def compile_captured(model, x, **options):
    """`model(x)` compiled with the oasr backend (no_grad) and a `Capture` as the user post-grad pass: the output
    and the last graph Inductor lowered."""
    from oasr_ops.inductor.backend import oasr_backend

    cap = Capture()
    with torch.no_grad():
        out = torch.compile(model, backend=oasr_backend, options={**options, "post_grad_custom_pre_pass": cap})(x)
    return out, cap.graphs[-1]


def ancestors(node: torch.fx.Node) -> set[torch.fx.Node]:
    """Every node `node` reads, transitively."""
    seen, todo = set(), [node]
    while todo:
        for a in todo.pop().all_input_nodes:
            if a not in seen:
                seen.add(a)
                todo.append(a)
    return seen


def calls(graph: torch.fx.Graph, op) -> list[torch.fx.Node]:
    """The nodes of `graph` calling `op`'s default overload."""
    return [n for n in graph.nodes if n.op == "call_function" and n.target is op.default]


@pytest.fixture
def fresh_inductor(monkeypatch, tmp_path):
    """An Inductor cache of the test's own and a reset compiler before and after: every compile runs the passes."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch.compiler.reset()
    yield
    torch.compiler.reset()


"""The inference-only Autograd kernel (oasr_ops/families/autograd.py): the no-grad call reaches the backend kernel
directly only when nothing sits between autograd and it; FakeTensor, a TorchDispatchMode and functionalization still
see the op; the grad case still raises on backward; every oasr op gives the same answers either way."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from oasr_ops.families.autograd import register_inference_op

_C = torch._C
_seen: list[bool] = []  # per CPU-kernel call: were the autograd keys excluded (i.e. reached by the redispatch)?
_functional: list[bool] = []  # per CPU-kernel call: was x a functionalization wrapper (it must never be)?


def _cpu(x: torch.Tensor, alpha: float) -> torch.Tensor:
    _seen.append(_C._dispatch_tls_is_dispatch_key_excluded(_C.DispatchKey.AutogradCPU))
    _functional.append(torch._is_functional_tensor(x))
    return x * alpha


def _fake(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.empty_like(x)


_lib = torch.library.Library("oasr", "FRAGMENT")
_lib.define("autograd_direct_probe(Tensor x, float alpha) -> Tensor")
register_inference_op(_lib, "autograd_direct_probe", cpu=_cpu, cuda=_cpu, fake=_fake)
_op = torch.ops.oasr.autograd_direct_probe.default


@pytest.fixture(autouse=True)
def _clear_seen():
    _seen.clear()
    _functional.clear()


@pytest.mark.parametrize("ctx", [torch.no_grad, torch.enable_grad])
def test_plain_tensors_call_the_kernel_directly(ctx):
    x = torch.randn(4, 3)
    with ctx():
        y = _op(x, 2.0)
    torch.testing.assert_close(y, x * 2.0)
    assert _seen == [False]  # no redispatch: the autograd keys were not excluded around the kernel
    assert y.grad_fn is None


def test_inference_mode_skips_the_autograd_kernel():
    x = torch.randn(4, 3)
    with torch.inference_mode():
        y = _op(x, 3.0)
    torch.testing.assert_close(y, x * 3.0)
    assert len(_seen) == 1  # the dispatcher went straight to the CPU kernel


def test_a_dispatch_mode_still_sees_the_op():
    seen_ops = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen_ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 3)
    with torch.no_grad(), Log():
        y = _op(x, 2.0)
    torch.testing.assert_close(y, x * 2.0)
    assert "oasr.autograd_direct_probe.default" in seen_ops  # the redispatch reached the mode's Python key


def test_fake_tensors_reach_the_fake_kernel():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(5, 2))
        with torch.no_grad():
            y = _op(x, 2.0)
    assert y.shape == (5, 2) and _seen == []  # the CPU kernel never saw a fake tensor


def test_functionalization_still_sees_the_op():
    def f(x):
        return _op(x, 2.0) + 1

    x = torch.randn(3, 3)
    with torch.no_grad():
        y = torch.func.functionalize(f)(x)
    torch.testing.assert_close(y, x * 2.0 + 1)
    assert _functional == [False]  # the Functionalize kernel unwrapped x before the CPU kernel ran


def test_grad_case_runs_and_backward_raises():
    x = torch.randn(4, 3, requires_grad=True)
    y = _op(x, 2.0)
    torch.testing.assert_close(y.detach(), x.detach() * 2.0)
    assert y.grad_fn is not None
    with pytest.raises(RuntimeError, match="oasr.autograd_direct_probe has no backward"):
        y.sum().backward()


def test_compiled_graph_through_the_direct_path():
    """torch.compile (aot_eager: real aten graph, FakeTensor tracing, functionalization) then plain calls."""
    def f(x):
        return torch.relu(_op(x, -1.5))

    x = torch.randn(6, 4)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        y = compiled(x)
    torch.testing.assert_close(y, torch.relu(x * -1.5))


def test_real_oasr_ops_answer_the_same_directly_and_redispatched():
    """gemm and scaled_mm on CPU: the direct call (no_grad) equals the redispatched one (a dispatch mode forces the
    redispatch), bit for bit."""
    from oasr_ops.families.scaled_mm.ops import quantize_per_token

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(3)
    a = torch.randn(7, 64, generator=g).half()
    w = torch.randn(32, 64, generator=g).half()
    b = torch.randn(32, generator=g).half()
    qa, sa = quantize_per_token(a.float())
    qw, sw = quantize_per_token(w.float())
    calls = [(torch.ops.oasr.gemm.default, (a, w, b, "gelu", "auto")),
             (torch.ops.oasr.scaled_mm.default, (qa, qw, sa, sw, b, torch.float16, "auto"))]
    for op, args in calls:
        with torch.no_grad():
            direct = op(*args)
            with Passthrough():
                redispatched = op(*args)
        assert torch.equal(direct, redispatched), op

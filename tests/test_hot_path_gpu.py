"""The C++ hot path of `oasr::gemm` on the GPU (families/hot_path.py, templates/hot_path.cpp; run: `pytest -m gpu`).

Every call answered in C++ must equal the Python path's answer bit for bit (the same plan: the same kernel or the
same aten calls), on fresh random inputs with the output poisoned with NaN first, for the torch arm, the fused
cuBLASLt arm, a CUTLASS kernel (the lane default) and `auto`, every activation, with and without bias, odd M and
3-D activations; and be within the kernels' own tolerance of an fp32 reference. The C++ table must have answered
(its call counts say so), run on the caller's stream (capture on a side stream fails otherwise), and leave bad
calls to Python (its errors, its misaligned fallback).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

MS = (1, 7, 17, 127, 1000)
NKS = ((256, 256), (3072, 768), (768, 3072))
ACTS = ("none", "relu", "gelu", "silu")


@pytest.fixture()
def hot():
    from oasr_ops.families import hot_path
    from oasr_ops.families.gemm import ops

    ops.reset_plans()
    hot_path.enable("CUDA")
    yield hot_path
    hot_path.disable()
    ops.reset_plans()


def _ref(a, w, b, act):
    y = F.linear(a.float(), w.float(), None if b is None else b.float())
    return {"none": y, "relu": torch.relu(y), "gelu": F.gelu(y), "silu": F.silu(y)}[act]


def _poisoned_call(fn, *args, out_shape, dtype):
    t = torch.full(out_shape, float("nan"), dtype=dtype, device="cuda")
    del t  # the caching allocator hands this block to the op's output next
    return fn(*args)


def _configs():
    if not torch.cuda.is_available():
        return []
    from oasr_ops.families.gemm.kernels import lanes_for
    from oasr_ops.runtime.arch import current_arch_family

    lanes = lanes_for(current_arch_family())
    return ["torch", "fused", "auto"] + ([lanes[0].default.id] if lanes else [])


@pytest.mark.parametrize("config", _configs())
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_cpp_answers_equal_python(hot, config, dtype):
    from oasr_ops.families.gemm import ops

    torch.manual_seed(0)
    gemm = torch.ops.oasr.gemm.default
    checked = hits = 0
    with torch.no_grad():
        for n, k in NKS:
            w = torch.randn(n, k, dtype=dtype, device="cuda") / k**0.5
            bias = torch.randn(n, dtype=dtype, device="cuda")
            for m in MS:
                shape = (m, k) if m % 2 else (1, m, k)  # 3-D activations too
                for b in (None, bias):
                    for act in ACTS:
                        a = torch.randn(*shape, dtype=dtype, device="cuda")
                        out_shape = (*shape[:-1], n)
                        first = _poisoned_call(gemm, a, w, b, act, config, out_shape=out_shape, dtype=dtype)
                        before = sum(p.calls for p in ops.served())
                        second = _poisoned_call(gemm, a, w, b, act, config, out_shape=out_shape, dtype=dtype)
                        hits += sum(p.calls for p in ops.served()) - before
                        hot.disable()  # the Python path's own answer for the same key
                        python = _poisoned_call(gemm, a, w, b, act, config, out_shape=out_shape, dtype=dtype)
                        hot.enable("CUDA")
                        torch.cuda.synchronize()
                        assert torch.equal(second, python), (config, m, n, k, act, b is not None)
                        assert torch.equal(first, python), (config, m, n, k, act, b is not None)
                        ref = _ref(a, w, b, act)
                        err = ((second.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
                        assert err < 1e-2, (config, m, n, k, act, err)
                        checked += 1
    assert checked == len(NKS) * len(MS) * 2 * len(ACTS)
    assert hits == checked  # each second call was answered (and counted) by the C++ table
    assert torch.ops.oasr_hot.size() > 0


def test_side_stream_capture_and_replay(hot):
    """Kernel and torch arms inside a CUDA graph captured on a side stream: a launch on any other stream would make
    the capture fail; the replay recomputes from new inputs."""
    from oasr_ops.families.gemm.kernels import lanes_for
    from oasr_ops.runtime.arch import current_arch_family

    kernel = lanes_for(current_arch_family())[0].default.id
    a = torch.randn(64, 512, dtype=torch.float16, device="cuda")
    w = torch.randn(1024, 512, dtype=torch.float16, device="cuda") / 512**0.5
    b = torch.randn(1024, dtype=torch.float16, device="cuda")
    gemm = torch.ops.oasr.gemm.default
    with torch.no_grad():
        for cfg in (kernel, "torch"):
            gemm(a, w, b, "gelu", cfg)  # installs the plan
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            y_kernel = gemm(a, w, b, "gelu", kernel)
            y_torch = gemm(a, w, b, "gelu", "torch")
        a.copy_(torch.randn_like(a))
        graph.replay()
        torch.cuda.synchronize()
    ref = _ref(a, w, b, "gelu")
    for y in (y_kernel, y_torch):
        assert ((y.float() - ref).abs().max() / ref.abs().max()).item() < 1e-2


def test_bad_calls_go_to_python(hot):
    from oasr_ops.families.gemm.kernels import lanes_for
    from oasr_ops.runtime.arch import current_arch_family

    kernel = lanes_for(current_arch_family())[0].default.id
    gemm = torch.ops.oasr.gemm.default
    a = torch.randn(33, 256, dtype=torch.float16, device="cuda")
    w = torch.randn(256, 256, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        gemm(a, w, None, "none", kernel)
        with pytest.raises(ValueError, match="contiguous"):
            gemm(a.t().contiguous().t(), w, None, "none", kernel)
        with pytest.raises(ValueError, match="activation"):
            gemm(a, w, None, "tanh", kernel)
        buf = torch.randn(33 * 256 + 1, dtype=torch.float16, device="cuda")
        shifted = buf[1:].view(33, 256)  # 2-byte offset: not 16-byte aligned
        y = gemm(shifted, w, None, "none", kernel)  # Python serves it with torch (warned once per signature)
        torch.testing.assert_close(y.float(), _ref(shifted, w, None, "none"), rtol=1e-2, atol=1e-2)


def test_inference_mode_is_answered_in_cpp(hot):
    """Under torch.inference_mode() the autograd keys are skipped: the CUDA kernel (C++) answers directly."""
    from oasr_ops.families.gemm.kernels import lanes_for
    from oasr_ops.runtime.arch import current_arch_family

    kernel = lanes_for(current_arch_family())[0].default.id
    a = torch.randn(2, 50, 512, dtype=torch.float16, device="cuda")
    w = torch.randn(768, 512, dtype=torch.float16, device="cuda") / 512**0.5
    b = torch.randn(768, dtype=torch.float16, device="cuda")
    with torch.inference_mode():
        for cfg in (kernel, "torch"):
            first = torch.ops.oasr.gemm.default(a, w, b, "silu", cfg)
            hot.collect_calls()
            second = torch.ops.oasr.gemm.default(a, w, b, "silu", cfg)
            assert sum(torch.ops.oasr_hot.drain_calls()[1::2]) == 1, cfg
            torch.cuda.synchronize()
            assert torch.equal(first, second), cfg


def test_grad_mode_forward_runs_backward_raises(hot):
    a = torch.randn(8, 64, dtype=torch.float16, device="cuda")
    w = torch.randn(32, 64, dtype=torch.float16, device="cuda", requires_grad=True)
    y = torch.ops.oasr.gemm.default(a, w, None, "none", "torch")
    assert y.requires_grad
    torch.testing.assert_close(y.float(), _ref(a, w.detach(), None, "none"), rtol=1e-2, atol=1e-2)
    with pytest.raises(RuntimeError, match="no backward"):
        y.sum().backward()


def test_backend_switches_it_on_without_cuda_graphs():
    """backend="oasr" without CUDA graphs serves its gemm sites from the C++ table; with CUDA graphs it does not
    switch anything on. Outputs match the eager model."""
    from oasr_ops.families import hot_path
    from oasr_ops.families.gemm import ops

    hot_path.disable()
    ops.reset_plans()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.SiLU(), torch.nn.Linear(1024, 256)).cuda().half()
    x = torch.randn(8, 100, 256, device="cuda", dtype=torch.float16)
    try:
        with torch.no_grad():
            graphs = torch.compile(model, backend="oasr", options={"mode": "reduce-overhead"})
            graphs(x)
            assert hot_path.enabled() is None
            compiled = torch.compile(model, backend="oasr", dynamic=True)
            for _ in range(3):
                y = compiled(x)
            assert hot_path.enabled() == "CUDA"
            ref = model(x)
        torch.testing.assert_close(y, ref, rtol=2e-2, atol=2e-2)
        assert torch.ops.oasr_hot.size() > 0
        answered = torch.ops.oasr_hot.drain_calls()  # (slot, calls) pairs counted by the C++ table
        assert sum(answered[1::2]) >= 4  # two sites: each one's first call installs, the next two are C++'s
    finally:
        hot_path.disable()
        ops.reset_plans()

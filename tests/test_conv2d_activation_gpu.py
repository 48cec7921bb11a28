"""The conv2d_activation kernels on the GPU: every config of the native lane (direct conv, CUTLASS 2.x and, on
sm90, 3.x implicit GEMM), fp16/bf16, odd frame counts, strides 1 and 2, padding, bias / no bias, every activation, NaN-poisoned
outputs, rel err < 1e-2 vs an fp32 reference (TF32 off); the untuned rule; CUDA-graph capture; the compiled
Conv2dSubsampling frontend (reduce-overhead) and its recorded sites.

Run: ``pytest -m gpu tests/test_conv2d_activation_gpu.py``. The lane's kernels (10 configs x 2 dtypes on sm90) are built
first, in parallel; with ``OASR_JIT_DIR`` pointing at a prebuilt directory that step only loads them.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU boxes too: skip cleanly
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import oasr_ops  # noqa: E402,F401
from examples import conformer  # noqa: E402
from oasr_ops.families.conv2d_activation import ops  # noqa: E402
from oasr_ops.runtime.arch import current_arch_family  # noqa: E402

ARCH = current_arch_family()
LANE = ops.native_lane(ARCH)
DIRECT = [c.id for c in LANE.space if c.generation == "dc"] if LANE is not None else []
IGEMM = [c.id for c in LANE.space if c.generation in ("2x", "3x")] if LANE is not None else []
DTYPES = [torch.float16, torch.bfloat16]
ACTS = {"none": lambda y: y, "relu": torch.relu, "silu": F.silu, "gelu": F.gelu}


@pytest.fixture(scope="module", autouse=True)
def built():
    from oasr_ops.codegen.jit import build_many
    from oasr_ops.families.conv2d_activation.kernels import prebuild_specs

    if LANE is None:
        pytest.skip(f"no conv2d lane runs on {ARCH}")
    report = build_many(prebuild_specs(ARCH, all_=True), progress=False)
    assert not report.failed, report.summary()


def make(b, h, w, cin, cout, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, h, w, cin, generator=g).to(dtype).cuda()
    wt = (torch.randn(cout, 3, 3, cin, generator=g) / (9 * cin) ** 0.5).to(dtype).cuda()
    bias = torch.randn(cout, generator=g).to(dtype).cuda()
    return x, wt, bias


def reference(x, w, b, stride, padding, act):
    """fp32 F.conv2d (TF32 off) + activation of the same operands, NHWC."""
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        y = F.conv2d(x.float().permute(0, 3, 1, 2), w.float().permute(0, 3, 1, 2), None if b is None else b.float(),
                     stride=stride, padding=padding)
    return ACTS[act](y).permute(0, 2, 3, 1)


def rel_err(y, r):
    return float((y.float() - r).abs().max() / r.abs().max().clamp(min=1e-6))


def poisoned_call(x, w, b, stride, padding, act, cfg):
    """Fill the block the output will reuse with NaN first: an element the kernel fails to write shows up."""
    ho = (x.shape[1] + 2 * padding[0] - 3) // stride[0] + 1
    wo = (x.shape[2] + 2 * padding[1] - 3) // stride[1] + 1
    p = torch.full((x.shape[0], ho, wo, w.shape[0]), float("nan"), dtype=x.dtype, device=x.device)
    del p
    return ops.conv2d_activation(x, w, b, stride=stride, padding=padding, activation=act, config=cfg)


def served_by(cfg):
    return any(p.config == cfg for p in ops.served())


def check(cfg, cases, dtype):
    for i, (b, h, w, cin, cout, stride, padding, with_bias, act) in enumerate(cases):
        x, wt, bias = make(b, h, w, cin, cout, dtype, seed=i + 17 * h)
        bb = bias if with_bias else None
        ops.reset_plans()
        y = poisoned_call(x, wt, bb, stride, padding, act, cfg)
        assert [p.config for p in ops.served()] == [cfg], (cfg, i)  # the kernel, not the torch fallback, served
        r = reference(x, wt, bb, stride, padding, act)
        assert y.shape == r.shape and y.dtype == dtype and y.is_contiguous()
        assert torch.isfinite(y).all(), (cfg, i)
        assert rel_err(y, r) < 1e-2, (cfg, i, rel_err(y, r))


@pytest.mark.parametrize("cfg", DIRECT)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("t", [3, 7, 250, 1001])
def test_every_direct_config(cfg, dtype, t):
    check(cfg, [(2, t, 80, 1, 512, (2, 2), (0, 0), True, "relu"),      # the frontend's first conv
                (1, t, 80, 1, 256, (2, 2), (0, 0), False, "none"),
                (2, t, 80, 1, 256, (2, 2), (1, 1), True, "gelu"),      # 3x3 Cin = 1 (register path) with borders
                (3, t, 21, 1, 72, (1, 1), (1, 1), False, "silu"),      # ... stride 1, partial channel tile
                (3, t, 17, 4, 24, (1, 1), (1, 1), True, "silu"),       # partial channel tile, 4 channels
                (1, t, 9, 3, 8, (2, 1), (1, 0), True, "gelu")], dtype)


@pytest.mark.parametrize("cfg", IGEMM)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("t", [3, 7, 125, 499])
def test_every_implicit_gemm_config(cfg, dtype, t):
    check(cfg, [(2, t, 39, 512, 512, (2, 2), (0, 0), True, "relu"),   # the frontend's second conv (Conformer M)
                (1, t, 39, 256, 256, (2, 2), (0, 0), False, "none"),
                (3, t, 11, 64, 200, (1, 1), (1, 1), True, "silu"),    # partial N tile, stride 1, same padding
                (1, t, 20, 32, 64, (2, 1), (1, 0), True, "gelu")], dtype)


def test_misaligned_views_run_the_torch_arm():
    x, w, b = make(1, 41, 39, 264, 256, torch.float16, 5)
    xs = x.reshape(-1)[8:].reshape(-1)[: 40 * 39 * 264].view(1, 40, 39, 264)  # an 8-element (16-byte) offset: aligned
    xo = x.reshape(-1)[1:][: 40 * 39 * 256].view(1, 40, 39, 256)              # a 2-byte offset: misaligned
    for xi, wi in ((xs, w), (xo, w[:, :, :, :256].contiguous())):
        for cfg in IGEMM:
            y = ops.conv2d_activation(xi, wi, b, stride=(2, 2), activation="relu", config=cfg)
            assert rel_err(y, reference(xi, wi, b, (2, 2), (0, 0), "relu")) < 1e-2, cfg


def test_untuned_rule_and_torch_arm():
    ops.reset_plans()
    x1, w1, b1 = make(2, 101, 80, 1, 256, torch.float16, 1)
    y1 = ops.conv2d_activation(x1, w1, b1, stride=(2, 2), activation="relu")
    assert served_by(LANE.default.id)
    xl, wl, bl = make(16, 1000, 80, 1, 512, torch.float16, 3)  # Conformer M's first conv: M = 311376 positions
    ops.reset_plans()
    yl = ops.conv2d_activation(xl, wl, bl, stride=(2, 2), activation="relu")
    assert served_by(ops.DIRECT_LARGE.id if ARCH in ops.DIRECT_LARGE_MEASURED else LANE.default.id)
    assert rel_err(yl, reference(xl, wl, bl, (2, 2), (0, 0), "relu")) < 1e-2
    del xl, yl
    x2, w2, b2 = make(2, 50, 39, 256, 256, torch.float16, 2)
    y2 = ops.conv2d_activation(x2, w2, b2, stride=(2, 2), activation="relu")
    assert served_by("fused" if ARCH in ops.FUSED_MEASURED else "torch")
    y3 = ops.conv2d_activation(x2, w2, b2, stride=(2, 2), activation="relu", config="torch")
    assert served_by("torch")
    y4 = ops.conv2d_activation(x2, w2, b2, stride=(2, 2), activation="relu", config="fused")  # cuDNN's fusion
    y5 = ops.conv2d_activation(x1, w1, b1, stride=(2, 2), activation="relu", config="fused")
    assert served_by("fused")
    for y, (x, w, b) in ((y1, (x1, w1, b1)), (y2, (x2, w2, b2)), (y3, (x2, w2, b2)), (y4, (x2, w2, b2)),
                         (y5, (x1, w1, b1))):
        assert rel_err(y, reference(x, w, b, (2, 2), (0, 0), "relu")) < 1e-2


@pytest.mark.parametrize("igemm", [IGEMM[0], IGEMM[-1]] if IGEMM else [])
def test_cuda_graph_capture(igemm):
    direct = LANE.default.id
    x, w1, b1 = make(2, 61, 80, 1, 256, torch.float16, 3)
    _, w2, b2 = make(1, 3, 3, 256, 256, torch.float16, 4)

    def frontend(x):
        y = ops.conv2d_activation(x, w1, b1, stride=(2, 2), activation="relu", config=direct)
        return ops.conv2d_activation(y, w2, b2, stride=(2, 2), activation="relu", config=igemm)

    frontend(x)  # plans made and kernels loaded outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = frontend(x)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    ref = reference(reference(x, w1, b1, (2, 2), (0, 0), "relu").to(x.dtype), w2, b2, (2, 2), (0, 0), "relu")
    assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("frames", [7, 1000])
def test_compiled_frontend(frames):
    from oasr_ops.inductor import rewrite as rw
    from oasr_ops.inductor.backend import oasr_backend

    torch.manual_seed(0)
    m = conformer.Conv2dSubsampling4(80, 256, 256).eval().cuda()
    x = torch.randn(4, frames, 80, device="cuda")
    with torch.no_grad():
        ref = m(x)
        mh = m.half()
        rw.clear_rewrite_log()
        torch.compiler.reset()
        with torch._inductor.config.patch(fx_graph_cache=False):  # the pass runs: its sites are read
            fn = torch.compile(mh, backend=oasr_backend, mode="reduce-overhead", dynamic=False)
            for _ in range(3):
                out = fn(x.half())
    sites = [s for r in rw.rewrite_log() for s in r.sites if s.family == "conv2d_activation"]
    assert [(s.op, s.k, s.activation) for s in sites] == [("conv2d_k3s2", 9, "relu"), ("conv2d_k3s2", 2304, "relu")]
    gemm = [(s.n, s.k) for r in rw.rewrite_log() for s in r.sites if s.family == "gemm"]
    assert gemm == [(256, 256 * 19)]  # the Linear after the free flatten, weight columns permuted
    assert rel_err(out, ref) < 1e-2

"""The depthwise conv1d kernels on the GPU: every config of the native conv1d lane, fp16/bf16, both layouts,
T in {1, 7, 250, 3001}, with and without bias / SiLU, outputs NaN-poisoned, rel err < 1e-2 vs the fp32
reference; the scalar (misaligned) path; CUDA-graph capture.

Run: ``pytest -m gpu tests/test_conv1d_gpu.py``. The lane's kernels (10 configs x 2 dtypes x 2 layouts) are built
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
from oasr_ops.families.conv1d import ops  # noqa: E402
from oasr_ops.runtime.arch import current_arch_family  # noqa: E402

ARCH = current_arch_family()
LANE = ops.native_lane(ARCH)
IDS = [c.id for c in LANE.space] if LANE is not None else []
DTYPES = [torch.float16, torch.bfloat16]


@pytest.fixture(scope="module", autouse=True)
def built():
    from oasr_ops.codegen.jit import build_many
    from oasr_ops.families.conv1d.kernels import prebuild_specs

    if LANE is None:
        pytest.skip(f"no conv1d lane runs on {ARCH}")
    report = build_many(prebuild_specs(ARCH, all_=True), progress=False)
    assert not report.failed, report.summary()


def reference(x, w, bias, layout, act):
    return ops.reference_conv1d_depthwise(x.cpu(), w.cpu(), None if bias is None else bias.cpu(), w.shape[-1] // 2,
                                          layout, act).float()


def poisoned_call(x, w, bias, layout, act, cfg):
    """Fill the block the output will reuse with NaN first: a frame the kernel fails to write shows up."""
    p = torch.full_like(x, float("nan"))
    del p
    return ops.conv1d_depthwise(x, w, bias, layout=layout, activation=act, config=cfg)


def rel_err(y, r):
    return float((y.float().cpu() - r).abs().max() / r.abs().max().clamp(min=1e-6))


def make(b, c, t, kw, layout, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (b, c, t) if layout == "bct" else (b, t, c)
    x = torch.randn(shape, generator=g).to(dtype).cuda()
    w = (torch.randn(c, 1, kw, generator=g) / kw ** 0.5).cuda()
    bias = torch.randn(c, generator=g).cuda()
    return x, w, bias


@pytest.mark.parametrize("cfg", IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["bct", "btc"])
@pytest.mark.parametrize("t", [1, 7, 250, 3001])
def test_every_config(cfg, dtype, layout, t):
    for i, (kw, with_bias, act, c) in enumerate(((31, True, "silu", 256), (15, False, "none", 96),
                                                  (3, True, "none", 64))):
        x, w, bias = make(2, c, t, kw, layout, dtype, seed=t * 7 + i)
        b = bias if with_bias else None
        y = poisoned_call(x, w, b, layout, act, cfg)
        assert y.shape == x.shape and y.dtype == dtype
        assert torch.isfinite(y).all(), (cfg, kw)
        assert rel_err(y, reference(x, w, b, layout, act)) < 1e-2, (cfg, kw)
    assert any(p.config == cfg for p in ops.served())  # the kernel, not the torch fallback, served


@pytest.mark.parametrize("layout", ["bct", "btc"])
def test_scalar_path_misaligned_and_odd_channels(layout):
    """A base pointer off 16 bytes, and (btc) C not a multiple of the vector width, run the 1-element path."""
    for c, offset in ((64, 1), (20, 0), (20, 3)):
        t, kw = 101, 9
        shape = (3, c, t) if layout == "bct" else (3, t, c)
        n = 3 * c * t
        buf = torch.randn(n + offset, device="cuda", dtype=torch.float16)
        x = buf[offset:].view(shape)
        w = torch.randn(c, 1, kw, device="cuda").half()  # weights in x's dtype too
        y = poisoned_call(x, w, None, layout, "silu", ops.native_lane(ARCH).default.id)
        assert torch.isfinite(y).all()
        assert rel_err(y, reference(x, w, None, layout, "silu")) < 1e-2, (c, offset)


def test_auto_and_sentinels():
    x, w, bias = make(8, 768, 200, 31, "btc", torch.float16, 0)
    r = reference(x, w, bias, "btc", "silu")
    for cfg in ("auto", "default", "torch"):
        y = poisoned_call(x, w, bias, "btc", "silu", cfg)
        assert rel_err(y, r) < 1e-2, cfg


def test_padding_frames_stay_finite():
    x, w, bias = make(2, 256, 300, 31, "btc", torch.float16, 1)
    x[1, 150:] = 0  # masked frames
    y = poisoned_call(x, w, bias, "btc", "silu", "auto")
    alone = ops.conv1d_depthwise(x[1:, :150].contiguous(), w, bias, layout="btc", activation="silu")
    assert torch.isfinite(y).all() and torch.equal(y[1:, :150], alone)


@pytest.mark.parametrize("layout", ["bct", "btc"])
def test_cuda_graph_capture(layout):
    x, w, bias = make(4, 512, 333, 31, layout, torch.bfloat16, 2)
    cfg = LANE.default.id
    ops.conv1d_depthwise(x, w, bias, layout=layout, activation="silu", config=cfg)  # plan + kernel load
    torch.cuda.synchronize()
    static_x = x.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = ops.conv1d_depthwise(static_x, w, bias, layout=layout, activation="silu", config=cfg)
    for seed in (3, 4):
        static_x.copy_(make(4, 512, 333, 31, layout, torch.bfloat16, seed)[0])
        g.replay()
        torch.cuda.synchronize()
        assert rel_err(y, reference(static_x, w, bias, layout, "silu")) < 1e-2


def test_matches_cudnn_module_chain():
    """Folded BatchNorm + SiLU through the op == nn.Conv1d -> BatchNorm1d(eval) -> SiLU in fp32."""
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(512, 512, 31, padding=15, groups=512).cuda()
    bn = torch.nn.BatchNorm1d(512).cuda().eval()
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    x = torch.randn(4, 512, 250, device="cuda")
    with torch.no_grad():
        expect = F.silu(bn(conv(x)))
        w2, b2 = ops.fold_batchnorm(conv.weight, conv.bias, bn)
        y = ops.conv1d_depthwise(x.half(), w2, b2, activation="silu", config=LANE.default.id)
    assert rel_err(y, expect.cpu()) < 1e-2


# ---- GLU prologue (glu=True: x has 2C channels, the conv reads a * sigmoid(g)) ----------------------------------

def glu_reference(x, w, bias, layout, act):
    return ops.reference_conv1d_depthwise(x.cpu(), w.cpu(), None if bias is None else bias.cpu(), w.shape[-1] // 2,
                                          layout, act, True).float()


@pytest.mark.parametrize("cfg", IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["bct", "btc"])
@pytest.mark.parametrize("t", [1, 7, 250, 3001])
def test_every_config_glu(cfg, dtype, layout, t):
    # C = 256: the vector path; C = 36 (bct: C * T not a multiple of the vector width for odd T; btc: C % 8 != 0):
    # the 1-element path
    for i, (kw, c) in enumerate(((31, 256), (15, 36))):
        x, w, bias = make(2, 2 * c, t, kw, layout, dtype, seed=t * 5 + i)
        w, bias = w[:c].contiguous(), bias[:c].contiguous()
        p = torch.full((2, c, t), float("nan"), device="cuda", dtype=dtype)  # poison the block the output reuses
        del p
        y = ops.conv1d_depthwise(x, w, bias, layout=layout, activation="silu", config=cfg, glu=True)
        assert y.shape == ((2, c, t) if layout == "bct" else (2, t, c)) and y.dtype == dtype
        assert torch.isfinite(y).all(), (cfg, kw, c)
        assert rel_err(y, glu_reference(x, w, bias, layout, "silu")) < 1e-2, (cfg, kw, c)
    assert any(p.config == cfg for p in ops.served())


@pytest.mark.parametrize("layout", ["bct", "btc"])
def test_glu_and_silu_saturate(layout):
    """Gates and pre-activations far in the sigmoid's tails (where 1 + e^-s passes 2^126 or overflows to inf and the
    kernel's fast division returns v * 0): finite outputs matching the fp32 reference."""
    c, t, kw = 64, 97, 31
    g = torch.Generator().manual_seed(11)
    a = torch.randn(2, c, t, generator=g) * 4
    gate = torch.tensor([-200.0, -100.0, -88.0, -87.0, -60.0, -10.0, 0.0, 10.0, 60.0, 100.0])
    gate = gate[torch.randint(0, gate.numel(), (2, c, t), generator=g)]
    x = torch.cat([a, gate], dim=1)  # [B, 2C, T]
    if layout == "btc":
        x = x.transpose(1, 2)
    x = x.contiguous().half().cuda()
    w = (torch.randn(c, 1, kw, generator=g) / kw ** 0.5).cuda()
    bias = torch.linspace(-300.0, 300.0, c).cuda()  # SiLU of pre-activations from about -300 to 300
    y = ops.conv1d_depthwise(x, w, bias, layout=layout, activation="silu", config=LANE.default.id, glu=True)
    assert torch.isfinite(y).all()
    r = glu_reference(x, w, bias, layout, "silu")
    err = (y.float().cpu() - r).abs()
    assert bool((err <= 1e-2 + 4e-3 * r.abs()).all()), float(err.max())  # elementwise: the ~0 tails included


@pytest.mark.parametrize("layout", ["bct", "btc"])
def test_cuda_graph_capture_glu(layout):
    x, w, bias = make(4, 1024, 251, 31, layout, torch.float16, 5)
    w, bias = w[:512].contiguous(), bias[:512].contiguous()
    cfg = LANE.default.id
    ops.conv1d_depthwise(x, w, bias, layout=layout, activation="silu", config=cfg, glu=True)
    torch.cuda.synchronize()
    static_x = x.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = ops.conv1d_depthwise(static_x, w, bias, layout=layout, activation="silu", config=cfg, glu=True)
    for seed in (6, 7):
        static_x.copy_(make(4, 1024, 251, 31, layout, torch.float16, seed)[0])
        g.replay()
        torch.cuda.synchronize()
        assert rel_err(y, glu_reference(static_x, w, bias, layout, "silu")) < 1e-2

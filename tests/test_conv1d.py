"""The conv1d family on the CPU: the depthwise op vs a float64 reference, bad input, opcheck, BatchNorm folding,
the dw config grammar, the lane, rendering, selection keys, and (slow) an nvcc build of both layouts."""
from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F

import oasr_ops  # noqa: F401  (registers the families)
from oasr_ops.configs import Config, ConfigError, dw_smem_bytes, parse
from oasr_ops.families.conv1d import ops
from oasr_ops.families.conv1d.lanes import DWCONV_DEFAULT, SM80_F16_DWCONV as LANE
from oasr_ops.runtime import registry

dw = ops.conv1d_depthwise


def ref64(x, w, bias, layout, activation):
    """An independent float64 formula: zero-padded window sums, then the activation."""
    xb = (x if layout == "bct" else x.transpose(1, 2)).double()
    kw = w.shape[-1]
    xp = F.pad(xb, (kw // 2, kw // 2))
    win = xp.unfold(2, kw, 1)  # [B, C, T, Kw]
    y = (win * w.double().reshape(1, -1, 1, kw)).sum(-1)
    if bias is not None:
        y = y + bias.double()[None, :, None]
    if activation == "silu":
        y = y * torch.sigmoid(y)
    return y if layout == "bct" else y.transpose(1, 2)


def make(b, c, t, kw, layout, dtype=torch.float16, wdtype=torch.float32, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (b, c, t) if layout == "bct" else (b, t, c)
    x = torch.randn(shape, generator=g).to(dtype)
    w = (torch.randn((c, 1, kw), generator=g) / kw ** 0.5).to(wdtype)
    bb = torch.randn(c, generator=g).to(wdtype) if bias else None
    return x, w, bb


@pytest.mark.parametrize("layout", ["bct", "btc"])
@pytest.mark.parametrize("t", [1, 7, 250, 3001])
@pytest.mark.parametrize("kw,act,bias", [(3, "none", False), (15, "silu", True), (31, "silu", True),
                                         (31, "none", True)])
def test_cpu_matches_float64(layout, t, kw, act, bias):
    x, w, b = make(2, 24, t, kw, layout, bias=bias, seed=t + kw)
    y = dw(x, w, b, layout=layout, activation=act)
    assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
    r = ref64(x, w, b, layout, act)
    assert torch.isfinite(y).all()
    err = (y.double() - r).abs().max() / r.abs().max().clamp(min=1e-6)
    assert err < 1e-2, err


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_layouts_agree_and_weight_dtypes(dtype):
    x, w, b = make(3, 16, 40, 9, "bct", dtype=dtype)
    y_bct = dw(x, w, b, layout="bct", activation="silu")
    y_btc = dw(x.transpose(1, 2).contiguous(), w, b, layout="btc", activation="silu")
    assert torch.equal(y_bct, y_btc.transpose(1, 2))
    # weights in x's dtype give the same formula on the rounded weights
    y_h = dw(x, w.to(dtype), b.to(dtype), activation="silu")
    assert torch.equal(y_h, dw(x, w.to(dtype).float(), b.to(dtype).float(), activation="silu"))


def test_non_contiguous_input_is_handled():
    x, w, b = make(2, 16, 33, 7, "btc")
    xv = x.transpose(1, 2)  # a [B, C, T] view of a [B, T, C] tensor
    assert torch.equal(dw(xv, w, b, layout="bct"), dw(xv.contiguous(), w, b, layout="bct"))


def test_padding_frames_stay_finite_and_do_not_leak():
    x, w, b = make(1, 8, 20, 31, "btc")
    x[:, 12:] = 0  # masked (padding) frames, as the example zeroes them
    y = dw(x, w, b, layout="btc", activation="silu")
    assert torch.isfinite(y).all()
    alone = dw(x[:, :12].contiguous(), w, b, layout="btc", activation="silu")
    assert torch.equal(y[:, :12], alone)  # zero padding == frames beyond T read as zero


def test_bad_input_errors():
    x, w, b = make(2, 8, 10, 5, "bct")
    cases = [
        (lambda: dw(x.float(), w, b), "dtype"),
        (lambda: dw(x, torch.randn(8, 1, 4), b), "odd"),
        (lambda: dw(x, torch.randn(8, 1, 33), b), "odd"),
        (lambda: dw(x, torch.randn(9, 1, 5), b), r"\[C, 1, Kw\]"),
        (lambda: dw(x, torch.randn(8, 2, 5), b), r"\[C, 1, Kw\]"),
        (lambda: dw(x[0], w, b), "3-D"),
        (lambda: dw(x, w, torch.randn(7)), "bias"),
        (lambda: dw(x, w.double(), b), "float32"),
        (lambda: dw(x, w, b, layout="tbc"), "layout"),
        (lambda: dw(x, w, b, activation="gelu"), "activation"),
        (lambda: dw(x, w, b, config="b64x64x64_w32x32x64_s3"), "conv1d lane"),
        (lambda: dw(x, w, b, config="nonsense"), "config"),
        (lambda: torch.ops.oasr.conv1d_depthwise(x, w, b, 1, "bct", "none", "auto"), "same"),
        (lambda: dw(x, w.to("meta"), b), "device"),
    ]
    for fn, match in cases:
        with pytest.raises(ValueError, match=match):
            fn()


@pytest.mark.parametrize("layout", ["bct", "btc"])
@pytest.mark.parametrize("t", [1, 7, 250])
def test_glu_prologue_matches_float64(layout, t):
    """glu=True: x has 2C channels; the conv reads F.glu(x) over the channel dim (an independent float64 GLU)."""
    x, w, b = make(2, 48, t, 15, layout, seed=t)
    w, b = w[:24].contiguous(), b[:24].contiguous()
    y = dw(x, w, b, layout=layout, activation="silu", glu=True)
    xd = x.double()
    a, g = (xd[:, :24], xd[:, 24:]) if layout == "bct" else (xd[..., :24], xd[..., 24:])
    r = ref64(a * torch.sigmoid(g), w, b, layout, "silu")
    assert y.shape == r.shape and y.dtype == x.dtype and y.is_contiguous()
    err = (y.double() - r).abs().max() / r.abs().max().clamp(min=1e-6)
    assert err < 1e-2, err


def test_glu_bad_input_errors():
    x, w, b = make(2, 9, 10, 5, "btc")
    with pytest.raises(ValueError, match="even channel count"):
        dw(x, w, b, layout="btc", glu=True)
    x, w, b = make(2, 16, 10, 5, "btc")
    with pytest.raises(ValueError, match=r"\[C, 1, Kw\]"):
        dw(x, w, b, layout="btc", glu=True)  # w must have C = 16 / 2 channels


def test_opcheck():
    x, w, b = make(2, 16, 19, 7, "btc")
    for args in ((x, w, b, 3, "btc", "silu", "auto"), (x.transpose(1, 2).contiguous(), w, None, 3, "bct", "none",
                                                         "dw64x64_v8_n256"),
                 (x, w[:8].contiguous(), b[:8].contiguous(), 3, "btc", "silu", "auto", True)):
        torch.library.opcheck(torch.ops.oasr.conv1d_depthwise.default, args)


def test_fold_batchnorm_matches_modules():
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(12, 12, 7, padding=3, groups=12)
    bn = torch.nn.BatchNorm1d(12).eval()
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    bn.weight.data.uniform_(0.5, 1.5)
    bn.bias.data.uniform_(-1, 1)
    x = torch.randn(2, 12, 30)
    w2, b2 = ops.fold_batchnorm(conv.weight, conv.bias, bn)
    assert w2.dtype == torch.float32 and w2.shape == conv.weight.shape
    torch.testing.assert_close(F.conv1d(x, w2, b2, padding=3, groups=12), bn(conv(x)), rtol=1e-5, atol=1e-5)
    w3, b3 = ops.fold_batchnorm(conv.weight, None, (bn.running_mean, bn.running_var, None, None, bn.eps))
    expect = (F.conv1d(x, conv.weight, None, padding=3, groups=12) - bn.running_mean[:, None]) / torch.sqrt(
        bn.running_var[:, None] + bn.eps)
    torch.testing.assert_close(F.conv1d(x, w3, b3, padding=3, groups=12), expect, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="eval"):
        ops.fold_batchnorm(conv.weight, conv.bias, torch.nn.BatchNorm1d(12).train())


# ---- config grammar, lane, rendering -------------------------------------------------------------------------

def test_dw_grammar_round_trips_and_keeps_gemm_ids():
    for c in LANE.space:
        assert parse(c.id) == c and c.generation == "dw" and Config.from_dict(c.to_dict()) == c
        assert c.to_dict()["threads"] == c.threads
    c = parse("dw64x64_v8_n256")
    assert (c.tile, c.alignment, c.threads, c.kernel_schedule) == ((64, 64, 1), 8, 256, "depthwise")
    for gid in ("b128x128x32_w64x64x32_s4", "t128x128x64_c2x1_coop", "t64x64x64_c1x1_pp_s4_a4"):
        g = parse(gid)
        assert g.id == gid and g.threads == 0 and "threads" not in g.to_dict()
    for bad in ("dw64x64_v8", "dw64x64_v3_n256", "dw63x64_v8_n256", "dw64x64_v8_n100", "dw64x64_v8_n256_a8",
                "dw064x64_v8_n256", "dw8x8_v8_n2048", "dw512x512_v8_n32", "dw64x64_v16_n256x"):
        with pytest.raises(ConfigError):
            parse(bad)
    with pytest.raises(ConfigError):
        Config(tile=(64, 64, 64), kernel_schedule="multistage", warp=(32, 32, 64), stages=3, threads=128)


def test_lane_is_registered_and_feasible():
    spec = registry.get("conv1d")
    assert spec.ops == ("conv1d", "conv1d_btc") and spec.exact_points and spec.policy == "default"
    # the depthwise matcher is wired into the graph pass as the family's rewrite handler
    from oasr_ops.families import conv1d as fam

    assert spec.handlers.get("rewrite") is fam._rewrite_handler
    for arch in ("sm80", "sm86", "sm89", "sm90"):
        assert spec.native_lane(arch) is LANE
        for c in LANE.space:
            assert LANE.infeasible_reason(c, n=768, k=31, arch_family=arch) is None, (arch, c.id)
    assert 6 <= len(LANE.space) <= 10 and LANE.default == DWCONV_DEFAULT
    assert LANE.infeasible_reason(DWCONV_DEFAULT, n=768, k=4) is not None
    assert all(dw_smem_bytes(c, 31) <= 99 * 1024 for c in LANE.space)


def test_render_every_config_and_variant():
    from oasr_ops.codegen.render import render

    for c in LANE.space:
        for v in ("fp16_bct", "fp16_btc", "bf16_bct", "bf16_btc"):
            src = render(LANE, c, v)
            tt, tc, _ = c.tile
            assert f"constexpr int kTileT = {tt};" in src and f"constexpr int kThreads = {c.threads};" in src
            assert f"constexpr int kRows = {tt * tc // c.threads};" in src
            assert ("constexpr bool kBct = true;" in src) == v.endswith("bct")
            assert ("__nv_bfloat16" in src.split("using Element = ")[1].split(";")[0]) == v.startswith("bf16")
            assert "case 31: return launch<31, V>" in src and "case 3: return launch<3, V>" in src
    with pytest.raises(ValueError):
        render(LANE, DWCONV_DEFAULT, "fp16_btt")
    with pytest.raises(ValueError):
        render(LANE, parse("b64x64x64_w32x32x64_s3"), "fp16_bct")


def test_selection_keys_and_untuned_policy(tuning_env):
    from oasr_ops.runtime import select as sel

    s = ops.select_config(torch.float16, "btc", 768, 31, 8, 200, "sm90")
    assert s == sel.Selection(DWCONV_DEFAULT.id, "default", "conv1d|op=conv1d_btc|dt=fp16|N=768|K=31")
    assert ops.signature("bct", 512, 15) == "conv1d|op=conv1d|dt=half|N=512|K=15"


# ---- nvcc ------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("cfg,variant,arch", [("dw64x64_v8_n256", "fp16_bct", "90a"),
                                              ("dw32x128_v8_n256", "bf16_btc", "80")])
def test_nvcc_builds_and_exports_the_launcher(tmp_path, monkeypatch, cfg, variant, arch):
    from oasr_ops.codegen.jit import JitSpec, nvcc_path
    from oasr_ops.families.conv1d.kernels import load_kernel

    if nvcc_path() is None:
        pytest.skip("nvcc not found")
    monkeypatch.setenv("OASR_JIT_DIR", str(tmp_path))
    spec = JitSpec(LANE, parse(cfg), variant, arch)
    lib = load_kernel(spec)  # builds, dlopens (no GPU needed), checks both ABI versions
    assert lib.describe.startswith(f"{cfg}|{variant}|sm80_f16_dwconv|")
    assert lib.can_implement(8, 3001, 768, 31, 1, 0) == 0 and lib.can_implement(8, 3001, 768, 31, 1, 1) == 0
    assert lib.can_implement(8, 3001, 768, 4, 1, 0) == 1  # even width
    assert lib.can_implement(8, 3001, 768, 33, 0, 0) == 1
    assert lib.can_implement(0, 10, 768, 31, 0, 0) == 1 and lib.can_implement(1, 10, 768, 31, 2, 0) == 1
    assert lib.can_implement(1, 10, 768, 31, 0, 2) == 1  # glu is a flag
    assert lib.workspace_size(8, 3001, 768, 31, 1, 1) == 0
    assert "-Werror" not in " ".join(spec.command(tmp_path / "a.cu", tmp_path / "a.so"))
    log = spec.log_path.read_text()
    assert "error" not in log.lower().replace("-werror", "")
    ctypes.CDLL(str(lib.path)).oasr_dwconv_abi_version()

"""int8 frontend convs on the CPU: `oasr::conv2d_activation_quant` (reference formula, op, fake, bad input, the
kernels' rounding trick, rendering of the int8-output variants and one real nvcc build with its C ABI), `QuantConv2d`
(qualifying rule, numerics, calibration, state dict, `quantize_`), and the fusion pass on real torch.compile graphs:
the first conv writes the second's int8 input, the int8 conv takes the ReLU, no node quantizes an fp16 activation."""
from __future__ import annotations

import copy
import ctypes
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import oasr_ops
from oasr_ops.codegen.render import render
from oasr_ops.configs import parse
from oasr_ops.families.conv2d_activation.lanes import SM90_F16_CONV2D
from oasr_ops.families.conv2d_activation.ops import quantize_output
from oasr_ops.families.conv2d_activation.ops_quant import reference_conv2d_quant
from oasr_ops.inductor import fuse_quant

from _fx_capture import ancestors, calls, compile_captured

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.conformer import Conv2dSubsampling4  # noqa: E402

OP = torch.ops.oasr.conv2d_activation_quant.default
OPS = torch.ops.oasr
DIRECT = [c for c in SM90_F16_CONV2D.space if c.generation == "dc"]


def operands(b=2, h=13, w=11, cin=1, cout=16, seed=0, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, h, w, cin, generator=g).to(dtype)
    wt = (torch.randn(cout, 3, 3, cin, generator=g) / 3).to(dtype)
    bias = (torch.randn(cout, generator=g) * 0.1).to(dtype)
    return x, wt, bias


@pytest.mark.parametrize("activation", ["none", "relu", "silu", "gelu"])
@pytest.mark.parametrize("stride,padding", [((2, 2), (0, 0)), ((1, 1), (1, 1))])
def test_reference_is_the_quantized_fp32_conv(activation, stride, padding):
    x, w, b = operands(seed=1)
    s = torch.tensor([0.01])
    got = reference_conv2d_quant(x, w, b, stride, padding, activation, s)
    y = F.conv2d(x.double().permute(0, 3, 1, 2), w.double().permute(0, 3, 1, 2), b.double(), stride=stride,
                 padding=padding)
    y = {"none": lambda t: t, "relu": torch.relu, "silu": F.silu, "gelu": F.gelu}[activation](y)
    want = torch.round(y / 0.01).clamp(-127, 127).to(torch.int8).permute(0, 2, 3, 1)
    assert got.dtype == torch.int8 and got.is_contiguous() and got.shape == want.shape
    diff = (got.int() - want.int()).abs()
    assert int(diff.max()) <= 1 and int((diff > 0).sum()) <= max(2, got.numel() // 500)
    assert int(got.min()) >= -127 and (got == 127).any()  # the clamp is reached and -128 never written


def test_op_cpu_fake_and_opcheck():
    x, w, b = operands(cout=24, seed=2)
    s = torch.tensor([0.02])
    out = oasr_ops.conv2d_activation_quant(x, w, s, b, stride=2, activation="relu")
    assert torch.equal(out, reference_conv2d_quant(x, w, b, (2, 2), (0, 0), "relu", s))
    torch.library.opcheck(OP, (x, w, b, [2, 2], [1, 1], "relu", s, "auto"))
    torch.library.opcheck(OP, (x, w, None, [1, 1], [0, 0], "none", s, "dc128x128_v8_n256"))


@pytest.mark.parametrize("mutate,match", [
    (lambda a: {**a, "out_scale": torch.tensor([0.1], dtype=torch.float64)}, "out_scale must be float32 \\[1\\]"),
    (lambda a: {**a, "out_scale": torch.tensor([0.1, 0.2])}, "out_scale must be float32 \\[1\\]"),
    (lambda a: {**a, "activation": "tanh"}, "activation must be one of"),
    (lambda a: {**a, "config": "t64x256x128_c1x1_ws"}, "config"),
    (lambda a: {**a, "x": a["x"].float()}, "dtype"),
    (lambda a: {**a, "w": a["w"][:, :, :, :0]}, "input channels"),
])
def test_bad_input_names_the_problem(mutate, match):
    x, w, b = operands()
    a = dict(x=x, w=w, bias=b, stride=[2, 2], padding=[0, 0], activation="relu", out_scale=torch.tensor([0.1]),
             config="auto")
    a = mutate(a)
    with pytest.raises(ValueError, match=match):
        OP(*a.values())


def test_the_kernels_rounding_trick_is_round_half_even_with_the_clamp():
    """to_out (templates/conv2d_direct.cu.j2): fma(v, inv_s, 1.5 * 2^23) then a clamp in that domain, the int8 being
    the low byte of the sum's bits. Emulated exactly (the product of two fp32 is exact in float64, then one rounding
    to fp32); equal to clamp(rint(fp32(v * inv_s))) but where the fp32 product is itself a .5 tie."""
    rng = np.random.default_rng(0)
    v = np.concatenate([rng.standard_normal(200_000).astype(np.float32) * 3, np.float32([0.5, -0.5, 1.5, 2.5])])
    inv = np.float32(1 / 0.02)
    bias = 12582912.0
    for relu_folded in (False, True):
        t = (v.astype(np.float64) * np.float64(inv) + bias).astype(np.float32)
        t = np.minimum(np.maximum(t, np.float32(bias if relu_folded else bias - 127)), np.float32(bias + 127))
        q = (t.view(np.int32) & 0xFF).astype(np.uint8).view(np.int8)
        vin = np.maximum(v, 0) if relu_folded else v
        want = quantize_output(torch.from_numpy(vin), torch.tensor([1 / inv], dtype=torch.float32)).numpy()
        ref_exact = np.clip(np.rint(vin.astype(np.float64) * np.float64(inv)), -127, 127).astype(np.int8)
        assert np.array_equal(q, ref_exact)  # one rounding of the exact product
        assert int((q != want).sum()) <= 2  # the fp32-product formula differs only at ties


def test_int8_output_variants_render_for_direct_configs_only():
    for cfg in DIRECT:
        for variant, element in (("fp16_q8", "__half"), ("bf16_q8", "__nv_bfloat16")):
            src = render(SM90_F16_CONV2D, cfg, variant)
            assert f"using Element = {element};" in src and "using OutElement = int8_t;" in src
            assert "OASR_EXPORT int oasr_conv2d_quant_run(" in src
        fp16 = render(SM90_F16_CONV2D, cfg, "fp16")
        assert "using OutElement = Element;" in fp16 and "oasr_conv2d_quant_run" not in fp16
    with pytest.raises(ValueError, match="needs a direct"):
        render(SM90_F16_CONV2D, parse("t128x128x64_c1x1_ws"), "fp16_q8")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.slow
def test_real_nvcc_build_of_an_int8_output_kernel(monkeypatch, tmp_path):
    """One int8-output direct kernel compiled for real (sm_90a) and its C ABI checked on the CPU."""
    from oasr_ops.codegen.jit import JitSpec, build_many
    from oasr_ops.families.conv2d_activation.kernels import load_quant_kernel

    monkeypatch.setenv("OASR_JIT_DIR", str(tmp_path))
    cfg = parse("dc256x128_v8_n128")
    spec = JitSpec.for_kernel(SM90_F16_CONV2D, cfg, "fp16_q8", "sm90")
    report = build_many([spec], jobs=1, progress=False)
    assert not report.failed, report.failed
    lib = ctypes.CDLL(str(spec.so_path))
    lib.oasr_describe.restype = ctypes.c_char_p
    assert lib.oasr_describe().decode().startswith(f"{cfg.id}|fp16_q8|sm90_f16_conv2d|")
    assert lib.oasr_conv2d_quant_abi_version() == 1
    shape = (2, 9, 11, 1, 16, 3, 3, 2, 2, 0, 0, 1)
    assert lib.oasr_conv2d_quant_can_implement(*shape) == 0
    assert lib.oasr_conv2d_quant_can_implement(2, 9, 11, 1, 12, 3, 3, 2, 2, 0, 0, 1) == 1  # Cout % 8
    assert lib.oasr_conv2d_run(*([None] * 4), *shape, None, 0, None) == 1  # the fp16 launcher refuses
    kern = load_quant_kernel(spec)  # the loader's ABI checks pass
    assert kern.can_implement(*shape) == 0


# ---------------------------------------------------------------------------------------------------- QuantConv2d

def test_qualifying_convs():
    from oasr_ops.families.conv2d_activation.quantize import qualifies

    assert qualifies(nn.Conv2d(32, 32, 3, stride=2))
    assert not qualifies(nn.Conv2d(1, 32, 3))            # Cin % 16
    assert not qualifies(nn.Conv2d(32, 36, 3))           # Cout % 8
    assert not qualifies(nn.Conv2d(32, 32, 3, groups=2))
    assert not qualifies(nn.Conv2d(32, 32, 3, dilation=2))
    assert not qualifies(nn.Conv2d(32, 32, 3, padding="same"))
    assert not qualifies(nn.Conv2d(32, 32, 3, padding=1, padding_mode="reflect"))


def _frontend(channels=128, seed=0):
    torch.manual_seed(seed)
    return Conv2dSubsampling4(80, channels, 64).half().eval()


def test_quant_conv2d_matches_the_conv_within_int8_error_and_calibration_round_trips():
    model = _frontend()
    x = torch.randn(2, 61, 80).half()
    with torch.no_grad():
        ref = copy.deepcopy(model).float()(x.float())
    q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8",
                           filter_fn=lambda m, fqn: isinstance(m, nn.Conv2d))
    layer = q.conv[2]
    assert isinstance(layer, oasr_ops.QuantConv2d) and isinstance(q.conv[0], nn.Conv2d)  # Cin = 1 stays
    assert layer.weight_q.shape == (128, 3, 3, 128) and not layer.calibrated
    with torch.no_grad():
        dyn = q(x)
    scales = oasr_ops.calibrate(q, [torch.randn(2, 61, 80).half() for _ in range(2)])
    assert "conv.2" in scales and layer.calibrated
    with torch.no_grad():
        cal = q(x)
    for y in (dyn, cal):
        assert float((y.float() - ref).abs().max() / ref.abs().max()) < 3e-2
    fresh = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8", filter_fn=lambda m, fqn: isinstance(m, nn.Conv2d))
    fresh.load_state_dict(q.state_dict())
    assert fresh.conv[2].calibrated and torch.equal(fresh.conv[2].input_scale, layer.input_scale)
    with torch.no_grad():
        assert torch.equal(fresh(x), cal)
    fresh.to(torch.float16)  # a dtype move keeps the int8 weight and the fp32 scales (CalibratedInput._apply)
    assert fresh.conv[2].scales.dtype == torch.float32 and fresh.conv[2].weight_q.dtype == torch.int8
    with torch.no_grad():
        assert torch.equal(fresh(x), cal)


def test_quantize_convs_option_and_bad_values():
    model = _frontend()
    q = oasr_ops.quantize_(copy.deepcopy(model), oasr_ops.Int8W8A8Config(convs=False))
    assert not any(isinstance(m, oasr_ops.QuantConv2d) for m in q.modules())
    assert isinstance(q.out, oasr_ops.QuantLinear)
    q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8")
    assert isinstance(q.conv[2], oasr_ops.QuantConv2d)
    with pytest.raises(ValueError, match="convs must be True or False"):
        oasr_ops.Int8W8A8Config(convs="yes")
    with pytest.raises(ValueError, match="does not qualify"):
        oasr_ops.QuantConv2d.from_conv(nn.Conv2d(1, 8, 3))


@pytest.mark.parametrize("channels,fusable", [(128, True), (256, True), (144, False)])
def test_fusable_filter_selects_the_second_frontend_conv(channels, fusable):
    """Selected where the int8 conv was measured to pay (Cout a multiple of 128); a 144-channel frontend stays fp16
    (every int8 tile would compute 256 columns: unmeasured, so not chosen)."""
    model = _frontend(channels)
    x = torch.randn(2, 61, 80).half()
    flt = oasr_ops.fusable_filter(copy.deepcopy(model), x)
    chosen = {fqn for fqn, m in model.named_modules() if fqn and flt(m, fqn)}
    assert ("conv.2" in chosen) == fusable and "conv.0" not in chosen


# ----------------------------------------------------------------------------------------------- the fusion pass

@pytest.mark.usefixtures("fresh_inductor")
def test_calibrated_frontend_compiles_to_int8_producer_and_int8_conv():
    model = _frontend()
    x = torch.randn(2, 61, 80).half()
    q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8", filter_fn=lambda m, fqn: isinstance(m, nn.Conv2d))
    oasr_ops.calibrate(q, [x])
    with torch.no_grad():
        eager = q(x)
    mark = fuse_quant.FUSE_LOG.mark()
    out, graph = compile_captured(q, x, fuse_quantization="act")
    rep = fuse_quant.FUSE_LOG.since(mark)
    assert sum(r.conv_quant for r in rep) == 1 and sum(r.conv_act for r in rep) == 1
    producer, = calls(graph, OPS.conv2d_activation_quant)
    conv, = calls(graph, OPS.conv2d_int8_activation)
    assert producer.args[5] == "relu" and conv.args[7] == "relu" and conv.args[0] is producer
    assert producer.args[6] is conv.args[2]  # the producer quantizes with the scale the int8 conv reads
    assert not calls(graph, torch.ops.aten.convolution)
    # nothing re-reads an fp16 activation to quantize it: no rounding node left, no relu on the conv output
    for target in (torch.ops.aten.round.default, torch.ops.aten.relu.default, torch.ops.aten.amax.default):
        assert not [n for n in graph.nodes if n.op == "call_function" and n.target is target]
    feats = next(n for n in graph.nodes if n.op == "placeholder" and n in ancestors(producer))
    assert feats is not None
    # the same values as the eager layers up to the first conv's rounding (fp32 here, fp16 then quantized eagerly)
    assert float((out.float() - eager.float()).abs().max() / eager.float().abs().max()) < 1e-2


@pytest.mark.usefixtures("fresh_inductor")
def test_uncalibrated_or_shared_producer_is_left_unfused_and_correct():
    model = _frontend()
    x = torch.randn(2, 61, 80).half()
    q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8", filter_fn=lambda m, fqn: isinstance(m, nn.Conv2d))
    with torch.no_grad():
        eager = q(x)
    mark = fuse_quant.FUSE_LOG.mark()
    out, graph = compile_captured(q, x, fuse_quantization="act")  # dynamic scale: the amax reads the activation
    rep = fuse_quant.FUSE_LOG.since(mark)
    assert sum(r.conv_quant for r in rep) == 0 and sum(r.conv_act for r in rep) == 1
    assert not calls(graph, OPS.conv2d_activation_quant)
    assert float((out.float() - eager.float()).abs().max() / eager.float().abs().max()) < 1e-2

    class Shared(nn.Module):  # the first conv's activated output also read elsewhere
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, feats):
            h = self.inner.conv[1](self.inner.conv[0](feats.unsqueeze(1)))
            return self.inner.conv[3](self.inner.conv[2](h)).mean() + h.mean()

    oasr_ops.calibrate(q, [x])
    s = Shared(q)
    with torch.no_grad():
        eager = s(x)
    mark = fuse_quant.FUSE_LOG.mark()
    torch.compiler.reset()
    out, graph = compile_captured(s, x, fuse_quantization="act")
    assert sum(r.conv_quant for r in fuse_quant.FUSE_LOG.since(mark)) == 0
    assert not calls(graph, OPS.conv2d_activation_quant)
    assert abs(float(out) - float(eager)) < 1e-2 * abs(float(eager)) + 1e-3


@pytest.mark.usefixtures("fresh_inductor")
@pytest.mark.parametrize("layers", ["all", "fusable"])
def test_options_quantization_converts_the_conv_into_the_same_fused_graph(layers):
    """`options={"quantization": ...}` on a plain model calibrated with `calibrate`: the conv becomes the nodes
    QuantConv2d runs, and the fusion gives the same graph as the quantize_ path; with convs=False it stays fp16."""
    model = _frontend()
    x = torch.randn(2, 61, 80).half()
    oasr_ops.calibrate(model, [x])
    with torch.no_grad():
        ref = copy.deepcopy(model).float()(x.float())
    cfg = oasr_ops.Int8W8A8Config(layers=layers)
    out, graph = compile_captured(model, x, quantization=cfg, fuse_quantization="act")
    producer, = calls(graph, OPS.conv2d_activation_quant)
    conv, = calls(graph, OPS.conv2d_int8_activation)
    assert conv.args[0] is producer and conv.args[7] == "relu"
    assert not calls(graph, torch.ops.aten.convolution)
    assert float((out.float() - ref).abs().max() / ref.abs().max()) < 3e-2
    torch.compiler.reset()
    _out, graph = compile_captured(model, x, quantization=oasr_ops.Int8W8A8Config(convs=False),
                                   fuse_quantization="act")
    assert not calls(graph, OPS.conv2d_int8_activation) and not calls(graph, OPS.conv2d_activation_quant)


@pytest.mark.usefixtures("fresh_inductor")
def test_options_quantization_of_an_uncalibrated_conv():
    """Not calibrated: `layers="all"` converts it with a dynamic scale (correct, unfused producer); `"fusable"`
    leaves it fp16 (its quantization could not be fused)."""
    model = _frontend(seed=3)  # a fresh model: no calibration recorded for its weights
    x = torch.randn(2, 61, 80).half()
    with torch.no_grad():
        ref = copy.deepcopy(model).float()(x.float())
    out, graph = compile_captured(model, x, quantization=oasr_ops.Int8W8A8Config(layers="all"),
                                  fuse_quantization="act")
    assert len(calls(graph, OPS.conv2d_int8_activation)) == 1 and not calls(graph, OPS.conv2d_activation_quant)
    assert float((out.float() - ref).abs().max() / ref.abs().max()) < 3e-2
    torch.compiler.reset()
    _out, graph = compile_captured(model, x, quantization="int8_w8a8", fuse_quantization="act")  # the default
    assert not calls(graph, OPS.conv2d_int8_activation)


def test_quantization_report_has_a_conv_line():
    q = oasr_ops.quantize_(_frontend(), "int8_w8a8")
    report = oasr_ops.quantization_report(q, arch="sm90")
    assert "conv2d_int8_activation: 1 quantized conv(s), 0 calibrated" in report
    assert report.splitlines()[0].startswith("scaled_mm: 1 quantized layer(s)")
    plain = oasr_ops.quantize_(_frontend(), oasr_ops.Int8W8A8Config(convs=False))
    assert "conv2d_int8" not in oasr_ops.quantization_report(plain, arch="sm90")


def test_quant_conv2d_input_rules():
    layer = oasr_ops.QuantConv2d.from_conv(nn.Conv2d(32, 16, 3, padding=1).half())
    layer.input_scale = torch.tensor([0.03])  # static: a batch and one of its samples quantize alike
    x = torch.randn(2, 32, 9, 7, generator=torch.Generator().manual_seed(0)).half()
    with torch.no_grad():
        batched = layer(x)
        assert batched.shape == (2, 16, 9, 7) and batched.dtype == torch.float16
        assert torch.equal(layer(x[1]), batched[1])  # unbatched [C, H, W], as nn.Conv2d
        with pytest.raises(ValueError, match=r"input must be \[B, 32, H, W\]"):
            layer(torch.randn(2, 16, 9, 7).half())
        with pytest.raises(ValueError, match="input must be"):
            layer(torch.randn(2, 32, 9).half().unsqueeze(0).unsqueeze(0))

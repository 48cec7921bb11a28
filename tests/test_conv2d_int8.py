"""oasr::conv2d_int8_activation on the CPU: the reference formula against an independent float64 conv, the op,
the fake (opcheck), bad input, the weight quantizer, rendering of the int8 variants (and the fp16 ones unchanged),
and one real nvcc build of an int8 kernel with its C ABI."""
from __future__ import annotations

import ctypes
import shutil

import pytest
import torch
import torch.nn.functional as F

import oasr_ops
from oasr_ops.codegen.render import render
from oasr_ops.configs import parse
from oasr_ops.families.conv2d_activation.lanes import SM90_F16_CONV2D, SM90_INT8_CONV2D
from oasr_ops.families.conv2d_activation.ops_int8 import quantize_conv_weight, reference_conv2d_int8

OP = torch.ops.oasr.conv2d_int8_activation.default


def operands(b=2, h=9, w=11, cin=32, cout=16, seed=0, out_dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-127, 128, (b, h, w, cin), dtype=torch.int8, generator=g)
    wq = torch.randint(-127, 128, (cout, 3, 3, cin), dtype=torch.int8, generator=g)
    sx = torch.rand(1, generator=g) * 0.02 + 1e-3
    sw = torch.rand(cout, generator=g) * 0.02 + 1e-3
    bias = torch.randn(cout, generator=g).to(out_dtype)
    return x, wq, sx, sw, bias


@pytest.mark.parametrize("activation", ["none", "relu", "silu", "gelu"])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("stride,padding", [((2, 2), (0, 0)), ((1, 1), (1, 1)), ((2, 1), (1, 0))])
def test_reference_is_the_dequantized_conv(activation, out_dtype, stride, padding):
    x, wq, sx, sw, bias = operands(out_dtype=out_dtype)
    got = reference_conv2d_int8(x, wq, sx, sw, bias, stride, padding, activation, out_dtype)
    # independent: dequantize, conv in float64, activation, round once
    xd = x.double().permute(0, 3, 1, 2) * sx.double()
    wd = wq.double().permute(0, 3, 1, 2) * sw.double().reshape(-1, 1, 1, 1)
    y = F.conv2d(xd, wd, bias.double(), stride=stride, padding=padding)
    y = {"none": lambda t: t, "relu": torch.relu, "silu": F.silu, "gelu": F.gelu}[activation](y)
    want = y.permute(0, 2, 3, 1)
    step = 2.0 ** -10 if out_dtype == torch.float16 else 2.0 ** -7  # one output step, relative
    assert got.dtype == out_dtype and got.is_contiguous() and got.shape == want.shape
    assert ((got.double() - want).abs() <= want.abs() * step + 1e-6).all()


def test_op_on_cpu_is_the_reference_and_auto_torch_and_tiles_agree():
    x, wq, sx, sw, bias = operands()
    want = reference_conv2d_int8(x, wq, sx, sw, bias, (2, 2), (1, 1), "relu", torch.float16)
    for config in ("auto", "torch", SM90_INT8_CONV2D.default.id):
        got = oasr_ops.conv2d_int8_activation(x, wq, sx, sw, bias, stride=2, padding=1, activation="relu",
                                              config=config)
        assert torch.equal(got, want)
    assert oasr_ops.conv2d_int8_activation(x, wq, sx, sw, None, stride=2).shape == (2, 4, 5, 16)


def test_opcheck():
    x, wq, sx, sw, bias = operands()
    for args in [(x, wq, sx, sw, bias, [2, 2], [0, 0], "relu", torch.float16, "auto"),
                 (x, wq, sx, sw, None, [1, 1], [1, 1], "none", torch.bfloat16, "torch")]:
        if args[4] is not None and args[8] != args[4].dtype:
            continue
        torch.library.opcheck(OP, args)


@pytest.mark.parametrize("mutate,match", [
    (lambda a: {**a, "x": a["x"].half()}, "x and w must be int8"),
    (lambda a: {**a, "scale_x": torch.ones(2)}, r"scale_x must be float32 \[1\]"),
    (lambda a: {**a, "scale_x": torch.ones(1, dtype=torch.float64)}, "scale_x must be float32"),
    (lambda a: {**a, "scale_w": torch.ones(15)}, r"scale_w must be float32 \[Cout\] = \[16\]"),
    (lambda a: {**a, "bias": a["bias"].float()}, "bias must be"),
    (lambda a: {**a, "w": a["w"][..., :16]}, "input channels"),
    (lambda a: {**a, "activation": "tanh"}, "activation must be one of"),
    (lambda a: {**a, "out_dtype": torch.float32}, "out_dtype must be float16 or bfloat16"),
    (lambda a: {**a, "config": "t128x128x64_c1x1_ws"}, "config must be"),
    (lambda a: {**a, "stride": [0, 1]}, "stride must be positive"),
    (lambda a: {**a, "x": a["x"][:, :1, :1]}, "smaller than the 3x3 filter"),
])
def test_bad_input_names_the_problem(mutate, match):
    x, wq, sx, sw, bias = operands()
    a = dict(x=x, w=wq, scale_x=sx, scale_w=sw, bias=bias, stride=[1, 1], padding=[0, 0], activation="relu",
             out_dtype=torch.float16, config="auto")
    a = mutate(a)
    with pytest.raises(ValueError, match=match):
        OP(*a.values())


def test_quantize_conv_weight():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(8, 3, 3, 16, generator=g)
    q, s = quantize_conv_weight(w)
    assert q.dtype == torch.int8 and s.shape == (8,) and s.dtype == torch.float32
    assert q.abs().amax(dim=(1, 2, 3)).eq(127).all()  # each channel's largest value maps to +-127
    assert ((q.float() * s.reshape(-1, 1, 1, 1) - w).abs() <= s.reshape(-1, 1, 1, 1) / 2 + 1e-7).all()
    with pytest.raises(ValueError, match="4-D float KRSC"):
        quantize_conv_weight(q)


def test_int8_variants_render_and_the_fp16_ones_do_not_change():
    for cfg in SM90_INT8_CONV2D.space:
        for variant, element in (("int8_fp16", "cutlass::half_t"), ("int8_bf16", "cutlass::bfloat16_t")):
            src = render(SM90_INT8_CONV2D, cfg, variant)
            assert "using ElementIn = int8_t;" in src and f"using Element = {element};" in src
            assert "OASR_EXPORT int oasr_conv2d_int8_run(" in src and "Sm90ScalarBroadcast<float>" in src
            assert f"Shape<_{cfg.tile[0]}, _{cfg.tile[1]}, Shape<_128>>" in src
    fp16 = render(SM90_F16_CONV2D, parse("t128x128x64_c1x1_ws"), "fp16")
    assert "int8" not in fp16 and "oasr_conv2d_run(const void* x" in fp16
    with pytest.raises(ValueError, match="needs an sm90 implicit-GEMM"):
        render(SM90_F16_CONV2D, parse("dc128x128_v8_n256"), "int8_fp16")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.slow
def test_real_nvcc_build_of_an_int8_conv_kernel(monkeypatch, tmp_path):
    """The default int8 tile compiled for real (sm_90a, ~1 min of nvcc) and its C ABI checked on the CPU."""
    from oasr_ops.codegen.jit import JitSpec, build_many

    monkeypatch.setenv("OASR_JIT_DIR", str(tmp_path))
    spec = JitSpec.for_kernel(SM90_INT8_CONV2D, SM90_INT8_CONV2D.default, "int8_fp16", "sm90")
    report = build_many([spec], jobs=1, progress=False)
    assert not report.failed, report.failed
    lib = ctypes.CDLL(str(spec.so_path))
    lib.oasr_describe.restype = ctypes.c_char_p
    assert lib.oasr_describe().decode().startswith(f"{SM90_INT8_CONV2D.default.id}|int8_fp16|sm90_int8_conv2d|")
    assert lib.oasr_conv2d_int8_abi_version() == 1
    shape = (2, 9, 11, 32, 16, 3, 3, 2, 2, 0, 0, 1)
    assert lib.oasr_conv2d_int8_can_implement(*shape) == 0
    assert lib.oasr_conv2d_int8_can_implement(2, 9, 11, 24, 16, 3, 3, 2, 2, 0, 0, 1) == 1  # Cin % 16
    assert lib.oasr_conv2d_run(*([None] * 4), *shape, None, 0, None) == 1  # the fp16 launcher refuses


def test_untuned_tile_avoids_wasted_columns():
    from oasr_ops.families.conv2d_activation.ops_int8 import untuned_tile

    assert untuned_tile(512) == untuned_tile(256) == SM90_INT8_CONV2D.default.id  # 64 x 256 fills them
    assert untuned_tile(384) == untuned_tile(128) == "t128x128x128_c1x1_ws"        # 256 wide would waste a third
    assert untuned_tile(144) == SM90_INT8_CONV2D.default.id  # both waste 112 columns: the measured default
    assert all(untuned_tile(c) in SM90_INT8_CONV2D.ids() for c in range(8, 1025, 8))

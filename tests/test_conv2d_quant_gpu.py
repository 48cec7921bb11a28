"""oasr::conv2d_activation_quant and the int8 frontend on the GPU (sm90): every direct config x shapes that take
each kernel path (the 3x3 Cin = 1 tensor-core and register paths, the staged path for Cin = 3) x activation x
fp16/bf16 against a float64 conv quantized by the op's rule, on memory poisoned with -128 (a value the op never
writes); `auto`; the `torch` arm; CUDA-graph capture with the scale read on the device; and the compiled frontend
(`QuantConv2d` + the fusion pass) against the same model run eagerly.

Run: ``pytest -m gpu tests/test_conv2d_quant_gpu.py`` (device step ``conv2d-quant-gpu``). The 20 direct kernels
(5 configs x fp16/bf16 x fp16/int8 output) are built first, in parallel; a prebuilt ``OASR_JIT_DIR`` only loads them.
"""
from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU boxes too: skip cleanly
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import oasr_ops  # noqa: E402
from oasr_ops.codegen.jit import JitSpec  # noqa: E402
from oasr_ops.families.conv2d_activation.lanes import SM90_F16_CONV2D as LANE  # noqa: E402
from oasr_ops.families.conv2d_activation.ops import quantize_output  # noqa: E402
from oasr_ops.runtime.arch import current_arch_family  # noqa: E402

DEV = "cuda"
ARCH = current_arch_family()
CONFIGS = [c.id for c in LANE.space if c.generation == "dc"]
# (B, H, W, Cin, Cout, stride, padding)
SHAPES = [
    (2, 199, 80, 1, 512, 2, 0),   # the Conformer M frontend's first conv, shorter input
    (1, 9, 11, 1, 24, 2, 0),      # partial tiles in M and channels
    (3, 33, 20, 1, 144, 2, 1),    # padding (border taps), Cout 144
    (2, 15, 13, 3, 64, 1, 1),     # Cin = 3: the staged kernel
    (1, 7, 7, 1, 8, 1, 1),        # tiny: fewer positions than one tile
]
ACTS = ("relu", "none", "gelu", "silu")


@pytest.fixture(scope="module", autouse=True)
def built():
    from oasr_ops.codegen.jit import build_many

    if ARCH not in LANE.arch_families:
        pytest.skip(f"the direct conv kernels' lane is sm90, this GPU is {ARCH}")
    specs = [JitSpec.for_kernel(LANE, c, v, ARCH) for c in LANE.space if c.generation == "dc"
             for v in ("fp16", "bf16", "fp16_q8", "bf16_q8")]
    report = build_many(specs, progress=False)
    print(report.summary(), flush=True)
    assert not report.failed, report.summary()


def _poison() -> None:
    """Fill and free a block with 0x80 bytes (int8 -128, which the op never writes: it clamps to +-127) so the
    op's output allocation reuses it: an element the kernel never writes stays -128."""
    t = torch.full((256 << 20,), 0x80, dtype=torch.uint8, device=DEV)
    del t


def operands(shape, dtype, seed):
    b, h, w, cin, cout, _, _ = shape
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(b, h, w, cin, device=DEV, generator=g).to(dtype)
    wt = (torch.randn(cout, 3, 3, cin, device=DEV, generator=g) / (9 * cin) ** 0.5).to(dtype)
    bias = (torch.randn(cout, device=DEV, generator=g) * 0.2).to(dtype)
    return x, wt, bias


def reference(x, w, bias, stride, padding, activation, out_scale):
    """The conv in float64 (exact for these operands up to the sum's rounding), its fp32 value, the op's rule."""
    y = torch.nn.functional.conv2d(x.double().permute(0, 3, 1, 2), w.double().permute(0, 3, 1, 2),
                                   None if bias is None else bias.double(), stride=stride, padding=padding)
    y = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
         "none": lambda t: t}[activation](y)
    return quantize_output(y.float(), out_scale).permute(0, 2, 3, 1).contiguous()


def scale_for(x, w, bias, stride, padding):
    """A per-tensor scale that saturates the largest ~1 % of outputs (the clamp is exercised too)."""
    y = torch.nn.functional.conv2d(x.float().permute(0, 3, 1, 2), w.float().permute(0, 3, 1, 2), bias.float(),
                                   stride=stride, padding=padding)
    return (y.abs().flatten().kthvalue(max(1, int(0.99 * y.numel()))).values / 127.0).reshape(1).float()


def check_q(got, want, off_fraction: float = 1e-3):
    """Every element within one step of `want`, and at most `off_fraction` of them one step off: a kernel's fp32
    value differs from the float64 sum's fp32 rounding by the summation order only, which moves q only where
    act(y) / out_scale is that close to a .5 boundary."""
    assert got.dtype == torch.int8 and got.shape == want.shape and got.is_contiguous()
    assert not (got == -128).any(), "unwritten (poisoned) outputs"
    diff = (got.int() - want.int()).abs()
    assert int(diff.max()) <= 1, f"max diff {int(diff.max())} steps"
    off = int((diff == 1).sum())
    assert off <= max(4, int(got.numel() * off_fraction)), f"{off} of {got.numel()} off"


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_config_matches_the_reference(config, shape, dtype):
    st, pd = (shape[5],) * 2, (shape[6],) * 2
    for i, activation in enumerate(ACTS):
        x, w, bias = operands(shape, dtype, seed=1000 * CONFIGS.index(config) + 10 * SHAPES.index(shape) + i)
        b = bias if i != 1 else None
        s = scale_for(x, w, bias, st, pd)
        _poison()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a silent fallback to the torch arm would make this test vacuous
            got = oasr_ops.conv2d_activation_quant(x, w, s, b, stride=st, padding=pd, activation=activation,
                                                   config=config)
        torch.cuda.synchronize()
        check_q(got, reference(x, w, b, st, pd, activation, s))


def test_auto_is_the_untuned_rule_and_the_torch_arm_agrees():
    from oasr_ops.families.conv2d_activation.ops import untuned_config

    shape = SHAPES[0]
    x, w, bias = operands(shape, torch.float16, seed=5)
    s = scale_for(x, w, bias, (2, 2), (0, 0))
    m = shape[0] * ((shape[1] - 3) // 2 + 1) * ((shape[2] - 3) // 2 + 1)
    rule = untuned_config(LANE, m, shape[4], 9, ARCH)
    a = oasr_ops.conv2d_activation_quant(x, w, s, bias, stride=2, activation="relu")
    d = oasr_ops.conv2d_activation_quant(x, w, s, bias, stride=2, activation="relu", config=rule)
    assert torch.equal(a, d)
    t = oasr_ops.conv2d_activation_quant(x, w, s, bias, stride=2, activation="relu", config="torch")
    # the torch arm quantizes the fp16-rounded conv output (2^-11 relative: up to 0.06 of a step at |q| ~ 127), so
    # more elements sit one step off than for a kernel (0.4 % measured on the H200), none further
    check_q(t, reference(x, w, bias, (2, 2), (0, 0), "relu", s), off_fraction=0.02)


def test_cuda_graph_capture_reads_input_and_scale_on_the_device():
    x, w, bias = operands(SHAPES[2], torch.float16, seed=7)
    s = scale_for(x, w, bias, (2, 2), (1, 1))
    f = lambda: oasr_ops.conv2d_activation_quant(x, w, s, bias, stride=2, padding=1, activation="relu")  # noqa
    f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = f()
    x2, _, _ = operands(SHAPES[2], torch.float16, seed=8)
    x.copy_(x2), s.mul_(1.7)  # new values in the captured buffers
    g.replay()
    torch.cuda.synchronize()
    check_q(out, reference(x, w, bias, (2, 2), (1, 1), "relu", s))


@pytest.mark.parametrize("path", ["quantize_", "options"])
def test_compiled_int8_frontend_matches_eager(path):
    """Conv2dSubsampling4 (C = 256) with its second conv int8 and calibrated — a QuantConv2d (`quantize_`) or the
    in-graph quantization of the plain model (``options={"quantization": ...}``) — compiled with the fusion pass:
    the first conv writes int8 (conv2d_activation_quant), the int8 conv takes the ReLU; the output agrees with the
    QuantConv2d layers run eagerly (there the first conv writes fp16 and a separate pass quantizes) and stays close
    to fp32."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from examples.conformer import Conv2dSubsampling4
    from oasr_ops.inductor.backend import oasr_backend
    from oasr_ops.inductor.fuse_quant import FUSE_LOG

    torch.manual_seed(0)
    ref_model = Conv2dSubsampling4(80, 256, 256).to(DEV).eval()
    model = copy.deepcopy(ref_model).half()
    feats = [torch.randn(4, 301, 80, device=DEV) for _ in range(3)]
    convs_only = lambda mod, fqn: isinstance(mod, torch.nn.Conv2d)  # noqa: E731
    q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8", filter_fn=convs_only)
    assert isinstance(q.conv[2], oasr_ops.QuantConv2d)
    oasr_ops.calibrate(q, [f.half() for f in feats[:2]])
    options = {"fuse_quantization": "act"}
    if path == "options":
        oasr_ops.calibrate(model, [f.half() for f in feats[:2]], filter_fn=convs_only)
        options["quantization"] = oasr_ops.Int8W8A8Config(layers="fusable")
    x = feats[2]
    with torch.no_grad():
        ref = ref_model(x)
        eager = q(x.half())
        mark = FUSE_LOG.mark()
        torch.compiler.reset()
        got = torch.compile(q if path == "quantize_" else model, backend=oasr_backend, options=options)(x.half())
    torch.cuda.synchronize()
    rep = FUSE_LOG.since(mark)
    assert sum(r.conv_quant for r in rep) == 1 and sum(r.conv_act for r in rep) == 1
    scale = ref.abs().max()
    assert float((got.float() - eager.float()).abs().max() / scale) < 1e-2
    assert float((got.float() - ref).abs().max() / scale) < 3e-2

"""oasr::conv2d_int8_activation on the GPU (sm90): every int8 tile x frontend-like shapes (the Conformer M second
conv at B=2, partial tiles, stride 1 with padding, small channel counts) x activation x fp16/bf16 output against
the float64 reference formula on freshly poisoned memory; `auto`; CUDA-graph capture with the scales read on the
device; the Cin % 16 fallback.

Run: ``pytest -m gpu tests/test_conv2d_int8_gpu.py`` (device step ``conv2d-int8-gpu``). The 8 kernels (4 tiles x 2
output dtypes) are built first, in parallel; with ``OASR_JIT_DIR`` pointing at a prebuilt directory that step only
loads them.
"""
from __future__ import annotations

import warnings

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU boxes too: skip cleanly
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import oasr_ops  # noqa: E402
from oasr_ops.codegen.jit import JitSpec  # noqa: E402
from oasr_ops.families.conv2d_activation.lanes import SM90_INT8_CONV2D as LANE  # noqa: E402
from oasr_ops.families.conv2d_activation.ops_int8 import OUT_DTYPES, reference_conv2d_int8  # noqa: E402
from oasr_ops.runtime.arch import current_arch_family  # noqa: E402

DEV = "cuda"
ARCH = current_arch_family()
TILES = list(LANE.ids())
# (B, H, W, Cin, Cout, stride, padding)
SHAPES = [
    (2, 499, 39, 512, 512, 2, 0),   # the Conformer M frontend's second conv (B=2 of its 16)
    (1, 37, 13, 512, 512, 2, 0),    # partial tiles in M
    (3, 20, 39, 256, 136, 2, 0),    # Cout not a multiple of the tile's N
    (2, 17, 7, 64, 64, 1, 1),       # stride 1, padding 1 (border taps)
    (1, 7, 9, 32, 48, 1, 1),        # tiny: fewer output positions than one tile
]


@pytest.fixture(scope="module", autouse=True)
def built():
    from oasr_ops.codegen.jit import build_many

    if ARCH not in LANE.arch_families:
        pytest.skip(f"the int8 conv kernels are sm90 only, this GPU is {ARCH}")
    specs = [JitSpec.for_kernel(LANE, c, v, ARCH) for c in LANE.space for v in OUT_DTYPES.values()]
    report = build_many(specs, progress=False)
    print(report.summary(), flush=True)
    assert not report.failed, report.summary()


def _poison() -> None:
    """Fill and free a block of memory with 0xFF bytes (fp16/bf16 NaN) so the op's output allocation reuses it:
    an element the kernel never writes stays NaN."""
    t = torch.full((256 << 20,), 0xFF, dtype=torch.uint8, device=DEV)
    del t


def operands(shape, out_dtype, seed):
    b, h, w, cin, cout, _, _ = shape
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randint(-127, 128, (b, h, w, cin), dtype=torch.int8, device=DEV, generator=g)
    wq = torch.randint(-127, 128, (cout, 3, 3, cin), dtype=torch.int8, device=DEV, generator=g)
    sx = torch.rand(1, device=DEV, generator=g) * 0.02 / (9 * cin) ** 0.5 + 1e-5
    sw = torch.rand(cout, device=DEV, generator=g) * 0.02 + 1e-3
    bias = (torch.randn(cout, device=DEV, generator=g) * 0.5).to(out_dtype)
    return x, wq, sx, sw, bias


def check_close(got, want, out_dtype):
    step = 2.0 ** -10 if out_dtype == torch.float16 else 2.0 ** -7  # one output step, relative
    assert not got.isnan().any(), "unwritten (poisoned) or NaN outputs"
    diff = (got.double() - want.double()).abs()
    bad = diff > want.double().abs() * step + 2.0 ** -20
    assert not bad.any(), f"{int(bad.sum())} of {got.numel()} beyond one step; max diff {diff.max().item():.3g}"


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
def test_tile_matches_the_reference(tile, shape, out_dtype):
    for i, activation in enumerate(("relu", "none", "silu")):
        x, wq, sx, sw, bias = operands(shape, out_dtype, seed=100 * TILES.index(tile) + 10 * SHAPES.index(shape) + i)
        st, pd = shape[5], shape[6]
        _poison()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a silent fallback to the reference would make this test vacuous
            got = oasr_ops.conv2d_int8_activation(x, wq, sx, sw, bias if i != 1 else None, stride=st, padding=pd,
                                                  activation=activation, out_dtype=out_dtype, config=tile)
        torch.cuda.synchronize()
        want = reference_conv2d_int8(x, wq, sx, sw, bias if i != 1 else None, (st, st), (pd, pd), activation,
                                     out_dtype)
        assert got.shape == want.shape and got.dtype == out_dtype and got.is_contiguous()
        check_close(got, want, out_dtype)


@pytest.mark.parametrize("cout,tile", [(512, LANE.default.id), (384, "t128x128x128_c1x1_ws")])
def test_auto_is_the_untuned_tile(cout, tile):
    from oasr_ops.families.conv2d_activation.ops_int8 import untuned_tile

    assert untuned_tile(cout) == tile
    x, wq, sx, sw, bias = operands((1, 37, 13, 512, cout, 2, 0), torch.float16, seed=5)
    a = oasr_ops.conv2d_int8_activation(x, wq, sx, sw, bias, stride=2, activation="relu")
    d = oasr_ops.conv2d_int8_activation(x, wq, sx, sw, bias, stride=2, activation="relu", config=tile)
    assert torch.equal(a, d)


def test_cuda_graph_capture_reads_inputs_and_scales_on_the_device():
    x, wq, sx, sw, bias = operands(SHAPES[2], torch.float16, seed=7)
    f = lambda: oasr_ops.conv2d_int8_activation(x, wq, sx, sw, bias, stride=2, activation="relu")  # noqa: E731
    f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = f()
    x2, _, sx2, sw2, _ = operands(SHAPES[2], torch.float16, seed=8)
    x.copy_(x2), sx.copy_(sx2), sw.copy_(sw2)  # new values in the captured buffers
    g.replay()
    torch.cuda.synchronize()
    check_close(out, reference_conv2d_int8(x, wq, sx, sw, bias, (2, 2), (0, 0), "relu", torch.float16),
                torch.float16)


def test_cin_not_a_multiple_of_16_runs_the_reference_with_one_warning():
    x, wq, sx, sw, bias = operands((1, 9, 9, 24, 16, 1, 1), torch.float16, seed=9)
    with pytest.warns(UserWarning, match="Cin must be a multiple of 16"):
        got = oasr_ops.conv2d_int8_activation(x, wq, sx, sw, bias, padding=1, activation="relu")
    assert torch.equal(got, reference_conv2d_int8(x, wq, sx, sw, bias, (1, 1), (1, 1), "relu", torch.float16))

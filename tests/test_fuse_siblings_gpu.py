"""The sibling-GEMM pass on the GPU (H200): a Whisper-small attention block (d = 768, q / k / v after one LayerNorm,
k without bias) quantized, calibrated and compiled with ``mode="reduce-overhead"`` (CUDA graphs) with and without
``fuse_siblings``; fresh random inputs at odd M (1, 7, 17, 999) and Whisper's M = 12000.

The q / k / v outputs through pointwise consumers must be bit-identical to the unfused compile (per column the
fused GEMM computes the same exact int32 accumulator and the same fp32 epilogue: tests/test_fuse_siblings.py);
the attention output close to it and to fp32 eager.

Run: ``pytest -m gpu tests/test_fuse_siblings_gpu.py`` (device step ``sib-gpu``). Kernels are built first, in
parallel (a no-op after the ``e2e-whisper-int8-sib`` prebuild).
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover - CPU CI never selects gpu tests
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import oasr_ops  # noqa: E402
from oasr_ops.codegen.jit import JitSpec, build_many  # noqa: E402
from oasr_ops.families.layer_norm_quant.kernels import cuda_arch_of, spec_for  # noqa: E402
from oasr_ops.families.layer_norm_quant.ops import auto_config  # noqa: E402
from oasr_ops.inductor.backend import oasr_backend  # noqa: E402
from oasr_ops.inductor.fuse_siblings import SIBLING_LOG  # noqa: E402
from oasr_ops.runtime.arch import current_arch_family  # noqa: E402
from oasr_ops.runtime.registry import get_lane  # noqa: E402

DEV = torch.device("cuda")
ARCH = current_arch_family()
SMM_LANE = get_lane("sm90_int8_wgmma" if ARCH == "sm90" else "sm80_int8_mma")
D, HEADS = 768, 12
SHAPES = ((1, 1), (1, 7), (1, 17), (3, 333), (8, 1500))  # (B, T): M = 1, 7, 17, 999, 12000


@pytest.fixture(scope="module", autouse=True)
def _built():
    # every fp16-output int8 tile ("auto" resolves N = 768 and the fused N = 2304 through the DB or the heuristic)
    # and the layer_norm_quant config served at d = 768
    specs = [JitSpec.for_kernel(SMM_LANE, c, "fp16", ARCH) for c in SMM_LANE.space]
    specs.append(spec_for(auto_config(D), torch.float16, "int8", cuda_arch_of(DEV)))
    rep = build_many(specs, progress=False)
    print(rep.summary(), flush=True)
    assert not rep.failed, rep.summary()


class Attention(nn.Module):
    """Whisper's pre-LN attention: x + out(SDPA(q, k, v)) with q / k / v = Linear(LN(x)); `pointwise` returns
    (2q, 2k, 2v) instead (exact consumers of the GEMM outputs)."""

    def __init__(self, pointwise=False):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.query, self.key, self.value = nn.Linear(D, D), nn.Linear(D, D, bias=False), nn.Linear(D, D)
        self.out = nn.Linear(D, D)
        self.pointwise = pointwise

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln(x)
        q, k, v = (lin(h) for lin in (self.query, self.key, self.value))
        if self.pointwise:
            return q * 2, k * 2, v * 2
        q, k, v = (y.view(b, t, HEADS, d // HEADS).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v)
        return x + self.out(y.transpose(1, 2).reshape(b, t, d))


def _compiled_pair(pointwise):
    torch.manual_seed(0)
    ref = Attention(pointwise).to(DEV).eval()
    calib = [torch.randn(2, 100, D, device=DEV, dtype=torch.float16) for _ in range(2)]
    q = oasr_ops.quantize_(copy.deepcopy(ref).half(), "int8_w8a8", filter_fn=lambda m, fqn: fqn != "out")
    oasr_ops.calibrate(q, calib)
    fns = {}
    for sib in (False, True):
        torch.compiler.reset()
        opts = {"mode": "reduce-overhead", "fuse_quantization": True, "fuse_siblings": sib}
        fns[sib] = torch.compile(copy.deepcopy(q), backend=oasr_backend, options=opts)
    return ref, fns


def _run(fn, x):
    with torch.no_grad():
        for _ in range(2):  # the second call replays the CUDA graph
            out = fn(x)
        torch.cuda.synchronize()
    return tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone()


def test_qkv_outputs_bit_identical_to_the_unfused_compile():
    _ref, fns = _compiled_pair(pointwise=True)
    mark = SIBLING_LOG.mark()
    for b, t in SHAPES:
        x = torch.randn(b, t, D, device=DEV, dtype=torch.float16)
        fused, unfused = _run(fns[True], x), _run(fns[False], x)
        for f, u in zip(fused, unfused):
            assert f.shape == (b, t, D) and torch.isfinite(f).all()
            assert torch.equal(f, u), (b, t, (f.float() - u.float()).abs().max().item())
    reps = [r for r in SIBLING_LOG.since(mark) if r.groups]
    assert reps and all(r.widths == [[D, D, D]] and not r.unfused for r in reps)


def test_attention_block_matches_unfused_and_fp32():
    ref, fns = _compiled_pair(pointwise=False)
    for b, t in SHAPES:
        x = torch.randn(b, t, D, device=DEV, dtype=torch.float16)
        fused, unfused = _run(fns[True], x), _run(fns[False], x)
        with torch.no_grad():
            want = ref(x.float())
        scale = want.abs().max().item()
        # identical q / k / v (above); SDPA may read the strided column slices through another code path
        assert (fused.float() - unfused.float()).abs().max().item() <= 1e-3 * scale, (b, t)
        assert (fused.float() - want).abs().max().item() <= 3e-2 * scale, (b, t)

"""The fp8 family's candidates and operands (the tuners' interface, `oasr_ops.families.candidate`).

Arms of ``scaled_mm_fp8|op=<scaled_mm_fp8|scaled_mm_fp8_quant>|N|K``: ``torch`` (torch._scaled_mm rowwise — a
candidate like any other, so the DB may answer it), every eligible tile of the native lane (no pruning, no cost
model; no Stream-K for the quantizing op) and the ``heuristic`` pseudo-arm (the tile the half-wave rule picks at
each point). The partition's fallback is ``torch``: measured on the H200 (docs/perf/scaled_mm_fp8.md), a first
build partitioned against the heuristic arm served tiles that lost to torch._scaled_mm by up to 29 % at census
shapes (torch was measured at every point but never the bar); with torch as the fallback a tile serves a region
only where it beats cuBLAS by the build's gate, which is what "torch is an arm" has to mean.

Numeric gates, per point (`lanes.summation_order`): the first tile of each order group (its representative) and
the heuristic arm are gated by tolerance: within 4x of cuBLAS's (`torch`'s) own max error against the float64
reference; every other tile of a group must equal its representative bitwise (and is rejected with it). The
plain op's gates run on bf16 output (what is timed) and on fp16 output (`Operands.variants`): the DB serves both.

The quantizing op's arms time the fused FFN fc1's kernel (`scaled_mm_fp8_act_quant` with `BUILD_ACTIVATION`; its
``torch`` arm is that op's: torch._scaled_mm, the activation and the quantization in eager ops), not the plain
`scaled_mm_fp8_quant` one: the fused fc1 is what a deployment runs under ``op=scaled_mm_fp8_quant``
(`tune/census_fused.py`), and the plain kernel's exact IEEE division made it up to 2.8x slower than the fused one
on the same tile and ranked the tiles differently (H100, session 39, 3984 x 2048 x 512: the plain op's best tile the
128x128 cooperative at 33.6 us, the fused op's the 128x256 cooperative FastAccum at 14.3 us; on the heuristic's
2x1 ping-pong 43.3 vs 15.3 us; docs/perf/e2e.md). The plain op, called directly, reads the same entries.
"""
from __future__ import annotations

from typing import Any

from ..candidate import Candidate, Gate, Operands
# the activation of the fused fc1 the quantizing op's arms time: the int8 family's (its candidates.py says why)
from ..scaled_mm.candidates import BUILD_ACTIVATION
from ...configs import parse
from . import ops as _ops
from .lanes import summation_order

HEURISTIC = "heuristic"
TOLERANCE = Gate("tolerance", baseline="torch", per_point=True, factor=4.0)


def _bind(op: str):
    def bind(o: Operands, config: str, copy: int):
        import torch

        a, sa = o.acts["a"], o.acts["sa"]
        sw, w = o.consts["sw"], o.weights[copy % o.copies]["w"]
        if op == "scaled_mm_fp8_quant":
            fn, out_scale = torch.ops.oasr.scaled_mm_fp8_act_quant, o.consts["out_scale"]
            return lambda: fn(a, w, sa, sw, None, out_scale, BUILD_ACTIVATION, config)
        fn, dt = torch.ops.oasr.scaled_mm_fp8, o.consts.get("out_dtype", torch.bfloat16)
        return lambda: fn(a, w, sa, sw, None, dt, config)
    return bind


def measure_dtype(parts: Any) -> str:
    """The kernel dtype the candidates run (the ``measure_dtype`` handler, read by ``prebuild --census``): bf16,
    the output torch._scaled_mm's rowwise path writes, so the ``torch`` arm is that one call; for the quantizing
    op the fused fc1's variant (e4m3 output, `BUILD_ACTIVATION`)."""
    import torch

    if parts.op == "scaled_mm_fp8_quant":
        return f"fp8_{BUILD_ACTIVATION}"
    return _ops.kernel_dtype(parts.op, torch.bfloat16)


def gate_dtypes(parts: Any) -> tuple[str, ...]:
    """Kernel dtypes the gates also run untimed (the ``gate_dtypes`` handler, read by ``prebuild --census``):
    fp16 output for the plain op (`operands`' variant), nothing for the quantizing op (its output is e4m3)."""
    return ("fp16",) if parts.op == "scaled_mm_fp8" else ()


def gates(ids: list[str]) -> dict[str, Gate]:
    """Each tile's gate: tolerance for the first of its order group, bitwise against that one for the rest."""
    first: dict[str, str] = {}
    out: dict[str, Gate] = {}
    for cid in ids:
        rep = first.setdefault(summation_order(parse(cid)), cid)
        out[cid] = TOLERANCE if rep == cid else Gate("bitwise", baseline=rep, per_point=True)
    return out


def candidates(parts: Any, arch: str) -> list[Candidate]:
    """``torch``, every eligible tile (group representatives first), then the heuristic pseudo-arm."""
    bind = _bind(parts.op)
    n, k = parts.n, parts.k
    ids = _ops.variants_for(n, k, parts.op == "scaled_mm_fp8_quant", arch)
    g = gates(ids)
    ordered = sorted(ids, key=lambda cid: g[cid].kind == "bitwise")  # stable: representatives first
    out = [Candidate("torch", bind, TOLERANCE, fallback=True)]
    out += [Candidate(cid, bind, g[cid]) for cid in ordered]
    out.append(Candidate(HEURISTIC, bind, TOLERANCE,
                         resolve=lambda p: _ops.heuristic_config(p.m, n, k, arch)))
    return out


def operands(point: Any, device: Any, seed: int = 0, *, copies: int = 1, like: Operands | None = None) -> Operands:
    """Normal activations / weights quantized to e4m3 per token / per channel (the deployment's scales);
    out_scale 4 sqrt(K) / 448; the float64 reference of copy 0 (saturated as the quantizing op saturates) for the
    tolerance gate."""
    import torch

    from ..scaled_mm.act_quant import apply_activation
    from .reference import FP8, quantize_per_token_fp8, quantize_weight_fp8

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    n, k = point.n, point.k
    if like is None:
        weights, sws = [], []
        for _ in range(copies):
            wq, sw = quantize_weight_fp8(torch.randn(n, k, generator=g, device=device))
            weights.append({"w": wq})
            sws.append(sw)
        # |y| is about sqrt(K) (unit-variance operands): a few values saturate e4m3's 448, most do not
        consts = {"sw": sws[0], "out_scale": torch.tensor([4.0 * k ** 0.5 / 448.0], device=device)}
    else:
        weights, consts = like.weights, like.consts
    a, sa = quantize_per_token_fp8(torch.randn(point.m, k, generator=g, device=device))
    assert a.dtype == FP8
    w0 = weights[0]["w"]

    def reference():
        acc = a.double() @ w0.double().t()
        y = sa.double().reshape(-1, 1) * consts["sw"].double().reshape(1, -1) * acc
        if point.op == "scaled_mm_fp8_quant":  # the fused fc1 (`_bind`): the activation, then the quantization
            y = (apply_activation(y, BUILD_ACTIVATION) / consts["out_scale"].double()).clamp(-448.0, 448.0)
        return y

    ops = Operands(point, {"a": a, "sa": sa}, consts, weights, reference)
    if point.op == "scaled_mm_fp8":
        # the DB has no dtype in its signatures: what it answers is served with fp16 output too. The build times
        # bf16 (torch._scaled_mm rowwise's one-call output) and gates both: FastAccum's error, hidden by bf16's
        # rounding, reached 5.4x cuBLAS's in fp16 at K=4864 (docs/perf/scaled_mm_fp8.md)
        ops.variants = [Operands(point, ops.acts, {**consts, "out_dtype": torch.float16}, weights, reference,
                                 label="fp16 output")]
    return ops


def census_from(parts: Any, weight_bytes: int) -> tuple[str, int] | None:
    """The scaled_mm_fp8 signature an fp8_w8a8 deployment runs for a gemm census signature (K % 16, N % 16; fp8
    weights are half the fp16 ones), or None."""
    if parts.family != "gemm" or parts.k % _ops.K_ALIGN or parts.n % _ops.N_ALIGN:
        return None
    return _ops.signature("scaled_mm_fp8", parts.n, parts.k), weight_bytes // 2

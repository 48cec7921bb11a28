"""The int8 scaled_mm family's candidates and operands (the tuners' interface, `oasr_ops.families.candidate`).

Arms of ``scaled_mm|op=<scaled_mm|scaled_mm_quant>|N|K``: every eligible tile of the native lane
(`ops.variants_for`: the nine sm90 tiles, Stream-K included, none for the quantizing op) — no pruning, no cost
model — and the ``heuristic`` pseudo-arm: the tile the shape heuristic picks at each point, timed under that
name, which is the partition's fallback (a region names a tile only where it beats the heuristic). Every tile
computes the same bits (exact int32 accumulation, one rounding), so the gate is bitwise equality with the
heuristic's tile at every point. The objective is GPU time alone (no host cost is charged).

A quantized deployment runs its Linear GEMMs as scaled_mm with the same (M, N, K), so `census_from` maps every
gemm census signature that `quantize_` quantizes (K % 16 == 0, N % 8 == 0) to its scaled_mm signature.

The quantizing op's arms time the fused FFN fc1's kernel (`scaled_mm_act_quant` with `BUILD_ACTIVATION`), not the
plain `scaled_mm_quant` one: what a deployment runs under ``op=scaled_mm_quant`` is that fused fc1 (the fusion pass
emits it; `tune/census_fused.py` records it there; `act_quant.select_act_quant_config` reads the entries), and the
plain kernel's exact IEEE division makes its epilogue 2-3x slower than the fused one's and ranks the tiles
differently (docs/perf/e2e.md, session 39). The plain op, called directly, reads the same entries.
"""
from __future__ import annotations

from typing import Any

from ..candidate import Candidate, Gate, Operands
from . import checks
from . import ops as _ops

HEURISTIC = "heuristic"
# The activation of the fused fc1 the quantizing op's arms time. The DB signature has none: one entry serves GELU
# (Whisper-style) and SiLU (Conformer) fc1s, whose epilogues differ by a few FMAs around the same one MUFU.TANH
# (templates/_act_fast.cuh.j2); GELU is the longer of the two.
BUILD_ACTIVATION = "gelu"


def _bind(op: str):
    def bind(o: Operands, config: str, copy: int):
        import torch

        a, sa = o.acts["a"], o.acts["sa"]
        sw, w = o.consts["sw"], o.weights[copy % o.copies]["w"]
        if op == "scaled_mm_quant":
            fn, out_scale = torch.ops.oasr.scaled_mm_act_quant, o.consts["out_scale"]
            return lambda: fn(a, w, sa, sw, None, out_scale, BUILD_ACTIVATION, config)
        fn, f16 = torch.ops.oasr.scaled_mm, torch.float16
        return lambda: fn(a, w, sa, sw, None, f16, config)
    return bind


def candidates(parts: Any, arch: str) -> list[Candidate]:
    """Every eligible tile, then the heuristic pseudo-arm (the bitwise reference and the fallback)."""
    bind = _bind(parts.op)
    n, k = parts.n, parts.k
    gate = Gate("bitwise", baseline=HEURISTIC, per_point=True)
    out = [Candidate(cid, bind, gate) for cid in _ops.variants_for(n, k, parts.op == "scaled_mm_quant", arch)]
    out.append(Candidate(HEURISTIC, bind, gate, fallback=True,
                         resolve=lambda p: _ops.heuristic_config(p.m, n, k, arch)))
    return out


def operands(point: Any, device: Any, seed: int = 0, *, copies: int = 1, like: Operands | None = None) -> Operands:
    """a, w uniform int8 in [-127, 127]; per-row / per-column fp32 scales in [0.001, 0.011]; out_scale 0.05."""
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    n, k = point.n, point.k
    if like is None:
        weights = [{"w": torch.randint(-127, 128, (n, k), generator=g, device=device, dtype=torch.int8)}
                   for _ in range(copies)]
        consts = {"sw": torch.rand(n, generator=g, device=device, dtype=torch.float32) * 0.01 + 0.001,
                  "out_scale": torch.tensor([0.05], device=device)}
    else:
        weights, consts = like.weights, like.consts
    a = torch.randint(-127, 128, (point.m, k), generator=g, device=device, dtype=torch.int8)
    sa = torch.rand(point.m, generator=g, device=device, dtype=torch.float32) * 0.01 + 0.001
    return Operands(point, {"a": a, "sa": sa}, consts, weights, None)


def measure_dtype(parts: Any) -> str:
    """The kernel dtype the candidates run (the ``measure_dtype`` handler, read by ``prebuild --census``): fp16
    output (`_bind`); for the quantizing op the fused fc1's variant, `BUILD_ACTIVATION` with no bias."""
    import torch

    from ...codegen.variants import act_variant

    if parts.op == "scaled_mm_quant":
        return act_variant(BUILD_ACTIVATION, None)
    return _ops.kernel_dtype(parts.op, torch.float16)


def census_from(parts: Any, weight_bytes: int) -> tuple[str, int] | None:
    """The scaled_mm signature a quantized deployment runs for another family's census signature (and its
    weight bytes: int8 weights are half the fp16 ones), or None."""
    if parts.family != "gemm" or parts.k % checks.K_ALIGN or parts.n % checks.N_ALIGN["scaled_mm"]:
        return None
    return _ops.signature("scaled_mm", parts.n, parts.k), weight_bytes // 2

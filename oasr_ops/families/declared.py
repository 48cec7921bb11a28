"""Families whose DB files the spec defines before this package has their kernels: the reader and the writer
accept their signatures and files (so a DB built elsewhere is not rejected), and selection answers their untuned
policy. Each moves into a folder of its own when its kernels land (conv1d has: families/conv1d/).
"""
from __future__ import annotations

from ..runtime import registry

# fp8 e4m3 W8A8: scaled_mm_fp8|op=scaled_mm_fp8[_quant]|N=..|K=.. (no dtype), untuned: a heuristic.
SCALED_MM_FP8 = registry.register(registry.FamilySpec(
    name="scaled_mm_fp8", ops=("scaled_mm_fp8", "scaled_mm_fp8_quant"), dtyped=False, policy="heuristic"))

"""One-time migration (2026-11-29): re-partition the shipped sm90 files from their H200 logs and stamp them with
the measuring run's validators (GPU SKU, nvcc, CUTLASS from the files the H200 wrote) and the *current*
`impl` hash. `impl` changed definition after the measurement (source files -> rendered kernel sources); the
rendered sources are byte-identical to the measured kernels (their JIT cache keys, which hash the rendered
source, are the ones built before the H200 runs), so the current hash describes what was measured.

  OASR_ARCH=sm90 python benchmarks/restamp_shipped_db.py GPU_GEMM_JSON GPU_SCALED_MM_JSON
"""
import json
import sys

from oasr_ops.tune import database
from oasr_ops.tune.build import BuildOptions, entries_from_log
from oasr_ops.runtime.validators import impl_hash

for family, log, gpu_file, lane, fallback in (
        ("gemm", "benchmarks/logs/sm90_gemm_build.jsonl", sys.argv[1], "sm90_f16_wgmma", "torch"),
        ("scaled_mm", "benchmarks/logs/sm90_scaled_mm_build.jsonl", sys.argv[2], "sm90_int8_wgmma", "heuristic")):
    entries, _ = entries_from_log(log, BuildOptions(arch="sm90"), fallback=fallback)
    stamp = dict(json.load(open(gpu_file))["validators"], impl=impl_hash(lane))
    print(family, database.publish(family, entries, tier="system", arch="sm90", lane=lane, fresh=True, stamp=stamp))

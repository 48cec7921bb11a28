"""Prebuild the fused-quantization kernels the GPU steps load (issue 15), which `oasr tune prebuild` does not plan
yet: every `layer_norm_quant` config (fp16/bf16, int8) and the `int8_gelu` / `int8_silu` epilogue variants of
the int8 tiles the e2e models resolve to on sm90 (lane default, the heuristic's tiles at the Conformer M and
Whisper-small FFN shapes).

  OASR_JIT_DIR=DIR python benchmarks/prebuild_fusion_kernels.py [--jobs 16]
"""
from __future__ import annotations

import argparse
import itertools

import torch

import oasr_ops  # noqa: F401  (registers the families)
from oasr_ops.codegen.jit import JitSpec, build_many
from oasr_ops.codegen.render_layer_norm_quant import THREADS_PER_ROW, VECS, LnqConfig
from oasr_ops.families.layer_norm_quant.kernels import spec_for
from oasr_ops.runtime import registry, select


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=None)
    a = p.parse_args()
    specs = [spec_for(LnqConfig(t, v), dt, "int8", "90a")
             for t, v in itertools.product(THREADS_PER_ROW, VECS) for dt in (torch.float16, torch.bfloat16)]
    lane = registry.native_lane("sm90", "scaled_mm")
    ids = {lane.default.id}
    for n, k, m in ((2048, 512, 3984), (3072, 768, 12000)):  # Conformer M fc1 at B=16 x 10 s; Whisper small, B=8
        ids.add(select.serve_config("scaled_mm", "scaled_mm_quant", "int8", n, k, m, "sm90").config)
    ids = {c for c in ids if c in lane.ids()}
    specs += [JitSpec.for_kernel(lane, lane.get(c), f"int8_{act}", "sm90") for c in sorted(ids)
              for act in ("gelu", "silu")]
    print(f"{len(specs)} kernels", flush=True)
    report = build_many(specs, jobs=a.jobs)
    print(report.summary())
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

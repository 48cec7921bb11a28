"""Does the residual add in the int8 GEMM's epilogue pay? (issue 15, `oasr::scaled_mm_residual`) On the GPU, at the
encoders' fc2 shapes, per data-parallel tile of the sm90 int8 lane and for what the compiled graph runs.

    python benchmarks/residual_gemm.py --out residual_gemm.json [--shapes 3984x512x2048,...] [--reps 15] [--jobs 16]
    python benchmarks/residual_gemm.py --prebuild-only --jobs 16      (the kernels `resid-gpu` runs, in parallel)

Per shape MxNxK (defaults: Conformer M's fc2, B=16 x 249 frames; its out-projection / pointwise2 shape if they were
int8; Whisper-small's fc2, B=8 x 1500 frames) and per tile:

  smm@tile          oasr::scaled_mm, fp16 output (the plain int8 GEMM)
  res@tile          oasr::scaled_mm_residual, residual + 0.5 * y in the epilogue (the C tile is TMA-loaded)
plus, once per shape, what the next block's LayerNorm sees (Inductor's one fused kernel either way):
  unfused           scaled_mm@auto, then torch.compile(s = r + 0.5 * y; LayerNorm(s) -> quantize_per_token):
                    the graph `fuse_quantization="act"` runs today (reads y and r, writes s, q, scale)
  fused             scaled_mm_residual@auto, then torch.compile(LayerNorm(s) -> quantize_per_token) (reads s)

Method: `benchmarks/scaled_mm.py`'s `time_graph` (each arm a CUDA graph of >= 16 calls, replayed --reps times,
median per call; weights rotate through enough copies to exceed 2x L2). Nothing is asserted; numbers that matter
go to docs/perf/e2e.md with this command line.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from act_quant_gemm import arm_timer, build_specs  # noqa: E402

DEFAULT_SHAPES = "3984x512x2048,3984x512x512,12000x768x3072"
ALPHA = 0.5


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    return [tuple(int(v) for v in item.lower().split("x")) for item in text.split(",") if item]


def kernel_specs() -> list:
    """fp16_res and the plain fp16 variant of every data-parallel tile, bf16_res and int8_gelu of the lane default
    (the GPU tests' compiled block): what `resid-gpu` and this benchmark load."""
    from oasr_ops.codegen.jit import JitSpec
    from oasr_ops.runtime.registry import get_lane

    lane = get_lane("sm90_int8_wgmma")
    specs = [JitSpec.for_kernel(lane, c, v, "sm90") for c in lane.data_parallel() for v in ("fp16_res", "fp16")]
    specs += [JitSpec.for_kernel(lane, lane.default, v, "sm90") for v in ("bf16_res", "int8_gelu")]
    return specs


def build(jobs: int) -> int:
    return 1 if build_specs(kernel_specs(), jobs).failed else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--calls", type=int, default=16)
    p.add_argument("--jobs", type=int, default=16)
    p.add_argument("--prebuild-only", action="store_true")
    p.add_argument("--out")
    a = p.parse_args()
    if build(a.jobs) and a.prebuild_only:
        return 1
    if a.prebuild_only:
        return 0
    if not a.out:
        raise SystemExit("--out is required (unless --prebuild-only)")

    import oasr_ops
    from oasr_ops.families.scaled_mm import ops, residual
    from scaled_mm import n_copies, time_graph

    dev = torch.device("cuda")
    torch._dynamo.config.cache_size_limit = 64
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "reps": a.reps, "calls": a.calls, "alpha": ALPHA, "rows": []}

    def ln_quant(s, lw, lb):
        h = torch.nn.functional.layer_norm(s, (s.shape[-1],), lw, lb)
        return ops.quantize_per_token(h)

    def add_ln_quant(y, r, lw, lb):
        s = r + ALPHA * y
        return (s, *ln_quant(s, lw, lb))

    after_fused = torch.compile(ln_quant, dynamic=False)
    after_unfused = torch.compile(add_ln_quant, dynamic=False)
    for m, n, k in parse_shapes(a.shapes):
        g = torch.Generator(device=dev).manual_seed(0)
        copies = n_copies(n * k * 2)
        x = torch.randn(m, k, device=dev, dtype=torch.float16, generator=g)
        q, sa = ops.quantize_per_token(x)
        w = [torch.randint(-127, 128, (n, k), dtype=torch.int8, device=dev, generator=g) for _ in range(copies)]
        sw = [torch.rand(n, device=dev, generator=g) / 127 / k ** 0.5 + 1e-5 for _ in range(copies)]
        b = (torch.randn(n, device=dev, generator=g) * 0.1).half()
        r = torch.randn(m, n, device=dev, dtype=torch.float16, generator=g)
        lw, lb = torch.rand(n, device=dev).half() + 0.5, torch.randn(n, device=dev).half() * 0.1
        row: dict = {"M": m, "N": n, "K": k, "us": {}}
        t = arm_timer(row, time_graph, copies, a.calls, a.reps)

        sel = residual.select_residual_config(n, k, m, "sm90")
        row["auto"] = {"config": sel.config, "tier": sel.tier,
                       "scaled_mm": ops.select_config(n, k, m, "sm90").config}
        t("unfused", lambda i: after_unfused(oasr_ops.scaled_mm(q, w[i], sa, sw[i], b), r, lw, lb))
        t("fused", lambda i: after_fused(oasr_ops.scaled_mm_residual(q, w[i], sa, sw[i], r, ALPHA, bias=b), lw, lb))
        y0 = torch.randn(m, n, device=dev, dtype=torch.float16, generator=g)
        t("add_ln_quant_only", lambda i: after_unfused(y0, r, lw, lb))
        t("ln_quant_only", lambda i: after_fused(r, lw, lb))
        for cid in ops.variants_for(n, k, quant=True, arch="sm90"):  # the data-parallel tiles
            t(f"smm@{cid}", lambda i, c=cid: oasr_ops.scaled_mm(q, w[i], sa, sw[i], b, config=c))
            t(f"res@{cid}", lambda i, c=cid: oasr_ops.scaled_mm_residual(q, w[i], sa, sw[i], r, ALPHA, bias=b,
                                                                        config=c))
        res["rows"].append(row)
        us = row["us"]
        fmt = lambda v: "   n/a" if v is None else f"{v:6.1f}"  # noqa: E731
        print(f"\n{m}x{n}x{k}: auto {sel.config} ({sel.tier}); GEMM + add/LN/quant: unfused {fmt(us.get('unfused'))} "
              f"us, fused {fmt(us.get('fused'))} us (add+LN+quant alone {fmt(us.get('add_ln_quant_only'))}, "
              f"LN+quant alone {fmt(us.get('ln_quant_only'))})", flush=True)
        print("  tile                      smm_fp16  residual", flush=True)
        for cid in ops.variants_for(n, k, quant=True, arch="sm90"):
            print(f"  {cid:24s} {fmt(us.get('smm@' + cid))}    {fmt(us.get('res@' + cid))}", flush=True)
    with open(a.out, "w") as fh:
        json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The activation-quantizing fp8 GEMM (`oasr::scaled_mm_fp8_act_quant`) per tile vs the plain fp8 GEMM vs fp16, on the
GPU, at the encoder FFN shapes (issue 15, fp8 part). The fp8 sibling of benchmarks/act_quant_gemm.py (its shapes,
parsing and `scaled_mm.time_graph` method).

    python benchmarks/act_quant_gemm_fp8.py --out act_quant_gemm_fp8.json [--shapes 3984x2048x512:silu,...]
        [--tiles all|heuristic] [--reps 15]

Per shape MxNxK:act and per data-parallel tile of the sm90 fp8 lane (`--tiles all`: every one the quantizing op
may serve; `heuristic`: the half-wave heuristic's candidates only):

  fp8_fp16          oasr::scaled_mm_fp8, fp16 output, no activation (the plain fp8 GEMM: the floor)
  fp8_quant         oasr::scaled_mm_fp8_quant, e4m3 output (static scale), no activation
  act_quant         oasr::scaled_mm_fp8_act_quant, the activation then e4m3 (what the fused FFN runs for fc1)
plus, once per shape:
  act_quant@auto    the config "auto" serves (its id is printed)
  fp8_quant@auto    the plain quantizing op on "auto" (what a direct user call gets; the selection is printed)
  fp8_quant@torch   the plain quantizing op's torch arm: torch._scaled_mm (fp32 out) + the epilogue and the e4m3
                    quantization in eager ops (the family's untuned policy, session 39's question: does it pay?)
  fp16_inductor     torch.compile(act(F.linear(x, w, b))): what fp16 backend="inductor" runs for fc1
  fp8_unfused       oasr::scaled_mm_fp8 (config auto: the DB or cuBLAS) then torch.compile(quantize_per_token_fp8(
                    act(y))): the pre-fusion fp8 path

Nothing is asserted; numbers that matter go to docs/perf/e2e.md with this command line.
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

from act_quant_gemm import (DEFAULT_SHAPES, act_fn, act_specs, arm_timer, build_specs, parse_shapes,  # noqa: E402
                            report_row)

VARIANTS = ("fp16", "fp8")


def tiles(n: int, k: int, which: str) -> list[str]:
    from oasr_ops.families.scaled_mm_fp8 import heuristic, ops
    from oasr_ops.runtime.registry import native_lane

    ids = ops.variants_for(n, k, quant=True, arch="sm90")
    if which == "heuristic":
        keep = set(heuristic.heuristic_ids(native_lane("sm90", "scaled_mm_fp8")))
        ids = [c for c in ids if c in keep]
    return ids


def build(shapes, which: str, jobs: int) -> None:
    from oasr_ops.families.scaled_mm_fp8.lanes import SM90_FP8_WGMMA as lane

    build_specs(act_specs(lane, shapes, lambda n, k: tiles(n, k, which), VARIANTS, "fp8"), jobs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES)
    p.add_argument("--tiles", choices=("all", "heuristic"), default="all")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--calls", type=int, default=16)
    p.add_argument("--jobs", type=int, default=16)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    shapes = parse_shapes(a.shapes)

    import oasr_ops
    from oasr_ops.families.scaled_mm_fp8.act_quant import select_act_quant_config
    from oasr_ops.families.scaled_mm_fp8.ops import select_quant_config
    from oasr_ops.families.scaled_mm_fp8.reference import quantize_per_token_fp8, quantize_weight_fp8
    from scaled_mm import n_copies, time_graph

    build(shapes, a.tiles, a.jobs)
    dev = torch.device("cuda")
    torch._dynamo.config.cache_size_limit = 64  # one compile per shape of the compiled baselines
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "reps": a.reps, "calls": a.calls, "tiles": a.tiles, "rows": []}
    for m, n, k, act in shapes:
        g = torch.Generator(device=dev).manual_seed(0)
        copies = n_copies(n * k)  # one byte per weight
        x = torch.randn(m, k, device=dev, dtype=torch.float16, generator=g)
        q, sa = quantize_per_token_fp8(x)
        wq = [quantize_weight_fp8(torch.randn(n, k, device=dev, generator=g)) for _ in range(copies)]
        w, sw = [t[0] for t in wq], [t[1] for t in wq]
        bias32 = torch.randn(n, device=dev, generator=g) * 0.1
        bias16 = bias32.half()
        wf = [torch.randn(n, k, device=dev, dtype=torch.float16, generator=g) / k ** 0.5 for _ in range(copies)]
        out_scale = torch.full((1,), 4.0 * k ** 0.5 / 448.0, device=dev)
        f = act_fn(act)
        row: dict = {"M": m, "N": n, "K": k, "act": act, "us": {}}
        t = arm_timer(row, time_graph, copies, a.calls, a.reps)

        sel = select_act_quant_config(n, k, m, "sm90")
        row["auto"] = {"config": sel.config, "tier": sel.tier}
        t("act_quant@auto", lambda i: oasr_ops.scaled_mm_fp8_act_quant(q, w[i], sa, sw[i], out_scale, act,
                                                                       bias=bias32))
        qsel = select_quant_config(n, k, m, "sm90")
        row["auto_quant"] = {"config": qsel.config, "tier": qsel.tier}
        t("fp8_quant@auto", lambda i: oasr_ops.scaled_mm_fp8_quant(q, w[i], sa, sw[i], out_scale, bias=bias32))
        t("fp8_quant@torch", lambda i: oasr_ops.scaled_mm_fp8_quant(q, w[i], sa, sw[i], out_scale, bias=bias32,
                                                                    config="torch"))
        ids = tiles(n, k, a.tiles)
        for cid in ids:
            t(f"fp8_fp16@{cid}", lambda i, c=cid: oasr_ops.scaled_mm_fp8(q, w[i], sa, sw[i], bias16, torch.float16,
                                                                         config=c))
            t(f"fp8_quant@{cid}", lambda i, c=cid: oasr_ops.scaled_mm_fp8_quant(q, w[i], sa, sw[i], out_scale,
                                                                               bias=bias32, config=c))
            t(f"act_quant@{cid}", lambda i, c=cid: oasr_ops.scaled_mm_fp8_act_quant(q, w[i], sa, sw[i], out_scale,
                                                                                   act, bias=bias32, config=c))
        lin_act = torch.compile(lambda x_, w_, b_: f(torch.nn.functional.linear(x_, w_, b_)), dynamic=False)
        t("fp16_inductor", lambda i: lin_act(x, wf[i], bias16))
        act_q = torch.compile(lambda y_: quantize_per_token_fp8(f(y_)), dynamic=False)
        t("fp8_unfused", lambda i: act_q(oasr_ops.scaled_mm_fp8(q, w[i], sa, sw[i], bias16, torch.float16)))
        res["rows"].append(row)
        report_row(row, ("fp8_fp16", "fp8_quant", "act_quant"), ids,
                   {"fp16 inductor": "fp16_inductor", "fp8 unfused": "fp8_unfused",
                    f"fp8_quant@auto ({qsel.config}, {qsel.tier})": "fp8_quant@auto",
                    "fp8_quant@torch": "fp8_quant@torch"})
    with open(a.out, "w") as fh:
        json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The activation-quantizing int8 GEMM (`oasr::scaled_mm_act_quant`) per tile vs the plain int8 GEMM vs fp16, on the
GPU, at the encoder FFN shapes (issue 15).

    python benchmarks/act_quant_gemm.py --out act_quant_gemm.json [--shapes 3984x2048x512:silu,...] [--reps 15]

Per shape MxNxK:act (defaults: Conformer M's FFN, B=16 x 249 frames, and the Whisper-style small encoder's, B=8 x
1500 frames) and per data-parallel tile of the sm90 int8 lane (`variants_for(n, k, quant=True)`):

  smm_fp16          oasr::scaled_mm, fp16 output, no activation (the plain int8 GEMM: the floor)
  smm_int8          oasr::scaled_mm_quant, int8 output (static scale), no activation
  act_quant         oasr::scaled_mm_act_quant, the activation then int8 (what the fused FFN runs for fc1)
plus, once per shape:
  act_quant@auto    the config "auto" serves (the DB / heuristic answer the compiled model gets; its id is printed)
  fp16_cublas+act   F.linear (cuBLAS) then the activation, eager: two kernels
  fp16_inductor     torch.compile(act(F.linear(x, w, b))): what fp16 backend="inductor" runs for fc1
  int8_unfused      oasr::scaled_mm (fp16 out) then torch.compile(quantize_per_token(act(y))): the pre-fusion path

Method: `benchmarks/scaled_mm.py`'s `time_graph` (each arm a CUDA graph of >= 16 calls, replayed --reps times,
median per call; weights rotate through enough copies to exceed 2x L2). Builds the kernels first (`--jobs`).
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

DEFAULT_SHAPES = "3984x2048x512:silu,3984x512x2048:silu,12000x3072x768:gelu,12000x768x3072:gelu"
VARIANTS = ("fp16", "int8")


def parse_shapes(text: str) -> list[tuple[int, int, int, str]]:
    out = []
    for item in text.split(","):
        dims, _, act = item.partition(":")
        m, n, k = (int(v) for v in dims.lower().split("x"))
        if act not in ("gelu", "silu"):
            raise SystemExit(f"--shapes: activation of {item!r} must be gelu or silu")
        out.append((m, n, k, act))
    return out


def act_fn(act: str):
    return torch.nn.functional.gelu if act == "gelu" else torch.nn.functional.silu


def build_specs(specs: list, jobs: int):
    """Build `specs` (`jobs` at a time) and print how many, how long and the summary; returns the build report."""
    from oasr_ops.codegen.jit import build_many

    t0 = time.perf_counter()
    rep = build_many(list(specs), jobs=jobs, progress=False)
    print(f"built {len(specs)} kernels in {time.perf_counter() - t0:.0f}s: {rep.summary()}", flush=True)
    return rep


def act_specs(lane, shapes, tiles, variants, prefix: str) -> list:
    """The kernels of every shape's tiles (`tiles(n, k)`) in `variants` and in the shape's activation variant
    (``<prefix>_<act>``), once each."""
    from oasr_ops.codegen.jit import JitSpec
    from oasr_ops.configs import parse

    specs = {}
    for _m, n, k, act in shapes:
        for cid in tiles(n, k):
            for v in (*variants, f"{prefix}_{act}"):
                s = JitSpec.for_kernel(lane, parse(cid), v, "sm90")
                specs[s.name] = s
    return list(specs.values())


def arm_timer(row: dict, time_graph, copies: int, calls: int, reps: int):
    """``t(name, call)``: time one arm into ``row["us"][name]``; an arm that fails (a kernel that does not build)
    records None and its error instead of losing the others."""
    def t(name, call):
        try:
            row["us"][name] = time_graph(call, copies, calls, reps)
        except Exception as e:
            row["us"][name] = None
            row.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"[:300]
            print(f"  {name}: {row['errors'][name]}", flush=True)
    return t


def report_row(row: dict, kinds: tuple[str, ...], ids: list[str], baselines: dict[str, str]) -> None:
    """Set ``row["best"]`` (the fastest tile of each kind of arm, ``<kind>@<tile>``) and print the row: auto's pick,
    the `baselines` (label -> arm name), and one line per tile with every kind's time."""
    us = row["us"]
    best = {kind: min(((v, kk) for kk, v in us.items() if kk.startswith(kind + "@") and v), default=(None, None))
            for kind in kinds}
    row["best"] = {kind: {"config": c.split("@")[1] if c else None, "us": v} for kind, (v, c) in best.items()}
    fmt = lambda v: "   n/a" if v is None else f"{v:6.1f}"  # noqa: E731
    auto = row["auto"]
    print(f"\n{row['M']}x{row['N']}x{row['K']} {row['act']}: auto = {auto['config']} ({auto['tier']}), act_quant@auto "
          f"{fmt(us.get('act_quant@auto'))} us; " + ", ".join(f"{label} {fmt(us.get(arm))}"
                                                           for label, arm in baselines.items()), flush=True)
    width = max((len(c) for c in ids), default=4)
    print(f"  {'tile':{width}s} " + "  ".join(f"{kind:>9s}" for kind in kinds), flush=True)
    for cid in ids:
        print(f"  {cid:{width}s} " + "  ".join(f"{fmt(us.get(f'{kind}@{cid}')):>9s}" for kind in kinds), flush=True)
    print("  best:", {kk: (v["config"], v["us"] and round(v["us"], 1)) for kk, v in row["best"].items()},
          flush=True)


def build(shapes, jobs: int) -> None:
    from oasr_ops.families.scaled_mm import ops
    from oasr_ops.families.scaled_mm.lanes import SM90_INT8_WGMMA as lane

    build_specs(act_specs(lane, shapes, lambda n, k: ops.variants_for(n, k, quant=True, arch="sm90"), VARIANTS,
                          "int8"), jobs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--calls", type=int, default=16)
    p.add_argument("--jobs", type=int, default=16)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    shapes = parse_shapes(a.shapes)

    import oasr_ops
    from oasr_ops.families.scaled_mm import act_quant, ops
    from scaled_mm import n_copies, time_graph

    build(shapes, a.jobs)
    dev = torch.device("cuda")
    torch._dynamo.config.cache_size_limit = 64  # one compile per shape of the compiled baselines
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "reps": a.reps, "calls": a.calls, "rows": []}
    for m, n, k, act in shapes:
        g = torch.Generator(device=dev).manual_seed(0)
        copies = n_copies(n * k * 2)
        x = torch.randn(m, k, device=dev, dtype=torch.float16, generator=g)
        q, sa = ops.quantize_per_token(x)
        w = [torch.randint(-127, 128, (n, k), dtype=torch.int8, device=dev, generator=g) for _ in range(copies)]
        sw = [torch.rand(n, device=dev, generator=g) / 127 / k ** 0.5 + 1e-5 for _ in range(copies)]
        bias32 = torch.randn(n, device=dev, generator=g) * 0.1
        bias16 = bias32.half()
        wf = [torch.randn(n, k, device=dev, dtype=torch.float16, generator=g) / k ** 0.5 for _ in range(copies)]
        out_scale = torch.full((1,), 4.0 / 127, device=dev)
        f = act_fn(act)
        row: dict = {"M": m, "N": n, "K": k, "act": act, "us": {}}
        t = arm_timer(row, time_graph, copies, a.calls, a.reps)

        sel = act_quant.select_act_quant_config(n, k, m, "sm90")  # what act_quant@auto runs
        row["auto"] = {"config": sel.config, "tier": sel.tier}
        t("act_quant@auto", lambda i: oasr_ops.scaled_mm_act_quant(q, w[i], sa, sw[i], out_scale, act, bias=bias32))
        for cid in ops.variants_for(n, k, quant=True, arch="sm90"):
            t(f"smm_fp16@{cid}", lambda i, c=cid: oasr_ops.scaled_mm(q, w[i], sa, sw[i], bias16, config=c))
            t(f"smm_int8@{cid}", lambda i, c=cid: oasr_ops.scaled_mm_quant(q, w[i], sa, sw[i], out_scale,
                                                                          bias=bias32, config=c))
            t(f"act_quant@{cid}", lambda i, c=cid: oasr_ops.scaled_mm_act_quant(q, w[i], sa, sw[i], out_scale, act,
                                                                               bias=bias32, config=c))
        t("fp16_cublas+act", lambda i: f(torch.nn.functional.linear(x, wf[i], bias16)))
        lin_act = torch.compile(lambda x_, w_, b_: f(torch.nn.functional.linear(x_, w_, b_)), dynamic=False)
        t("fp16_inductor", lambda i: lin_act(x, wf[i], bias16))
        act_q = torch.compile(lambda y_: ops.quantize_per_token(f(y_)), dynamic=False)
        t("int8_unfused", lambda i: act_q(oasr_ops.scaled_mm(q, w[i], sa, sw[i], bias16)))
        res["rows"].append(row)
        report_row(row, ("smm_fp16", "smm_int8", "act_quant"), ops.variants_for(n, k, quant=True, arch="sm90"),
                   {"fp16 cuBLAS+act": "fp16_cublas+act", "inductor": "fp16_inductor", "int8 unfused": "int8_unfused"})
    with open(a.out, "w") as fh:
        json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Does the shipped gemm DB hold between its measured points? (issue 11's check of db/sm90/gemm.json)

  OASR_TUNE_USER_DB=off python benchmarks/db_between_points.py --log benchmarks/logs/sm90_gemm_build.jsonl \
      --out between.json

For every signature of the tuning file: the Ms the build measured (its log, validation points included) and the
geometric midpoints between consecutive ones (held out: never measured by the build). At each M, fp16 with bias
(SiLU for gemm_activation), `oasr.gemm(config="auto")` (what the DB serves) and cuBLAS (`F.linear` [+ `F.silu`])
are timed `--rounds` times each (3) in alternating order (AB, BA, ...) as CUDA graphs of 20 calls (median). Reports auto/cuBLAS geomean at the
measured Ms and at the midpoints, and the worst midpoint.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections import defaultdict

import torch
import torch.nn.functional as F

from cost_model_heldout import alternating_us  # same timing protocol as the held-out check


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--log", required=True, help="the build's measurement log (the Ms it measured)")
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=3, help="alternating cuBLAS/auto timings per point (median)")
    a = p.parse_args()
    os.environ.setdefault("OASR_TUNE_USER_DB", "off")
    import oasr_ops
    from oasr_ops.runtime.database import parse_signature

    measured: dict[str, set[int]] = defaultdict(set)
    with open(a.log) as f:
        for line in f:
            r = json.loads(line)
            measured[r["signature"]].add(int(r["m"]))
    rows = []
    t0 = time.perf_counter()
    for sig, ms in sorted(measured.items()):
        parts = parse_signature(sig)
        if parts is None or parts.family != "gemm":
            continue
        act = "silu" if parts.op == "gemm_activation" else "none"
        n, k = parts.n, parts.k
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) * k ** -0.5
        bias = torch.randn(n, device="cuda", dtype=torch.float16)
        ms_sorted = sorted(ms)
        mids = sorted({round(math.sqrt(x * y)) for x, y in zip(ms_sorted, ms_sorted[1:]) if y / x >= 1.2} - ms)
        for m, kind in [(m, "measured") for m in ms_sorted] + [(m, "midpoint") for m in mids]:
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            ref = (lambda: F.linear(x, w, bias)) if act == "none" else (lambda: F.silu(F.linear(x, w, bias)))
            t_torch, t_auto = alternating_us(ref, lambda: oasr_ops.gemm(x, w, bias, act, "auto"), a.rounds)
            rows.append({"signature": sig, "m": m, "kind": kind, "torch_us": t_torch, "auto_us": t_auto,
                         "speed_vs_torch": t_torch / t_auto})
        print(f"{sig}: {len(ms_sorted)} measured, {len(mids)} midpoints", flush=True)
    gm = lambda xs: math.exp(sum(math.log(v) for v in xs) / len(xs))  # noqa: E731
    summary = {}
    for kind in ("measured", "midpoint"):
        sp = [r["speed_vs_torch"] for r in rows if r["kind"] == kind]
        worst = min((r for r in rows if r["kind"] == kind), key=lambda r: r["speed_vs_torch"])
        summary[kind] = {"points": len(sp), "geomean": gm(sp), "min": min(sp), "below_0.95": sum(s < 0.95 for s in sp),
                         "worst": {k: worst[k] for k in ("signature", "m", "speed_vs_torch")}}
    summary["wall_s"] = time.perf_counter() - t0
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "date": time.strftime("%Y-%m-%d"), "summary": summary, "rows": rows}, f, indent=1)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

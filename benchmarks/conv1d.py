"""Depthwise conv1d (`oasr::conv1d_depthwise`) on the GPU: every config of the native conv1d lane and ``auto``
vs `F.conv1d` (cuDNN) as Inductor runs it, at the Conformer conv-module shapes of the example censuses.

    python benchmarks/conv1d.py --out conv1d.json [--reps 15] [--kws 15 31] [--dtypes fp16 bf16]

Shapes: C = d_model of Conformer S/M/L (256/512/1024, plus 768: the width of the encoder whose
profile motivated this family), Kw in --kws, (B, T') from benchmarks/census/conformer_{S,M,L}_offline.json keys
with traffic (T' = output_frames(frames)), plus B=8 T'=200 (8 s). Per shape, fp16/bf16:

* ``cudnn_bct``: ``F.conv1d(x[B, C, T], w, b, groups=C)`` + SiLU — what the conv1d form runs (no layout change);
* ``cudnn_btc``: the Linear form as Inductor runs it: ``x[B, T, C].transpose(1, 2)`` -> F.conv1d -> SiLU ->
  ``.transpose(1, 2).contiguous()`` (cuDNN inserts its own NCHW<->NHWC conversions inside);
* ``transpose_roundtrip``: ``x.transpose(1, 2).contiguous()`` twice (the explicit layout copies alone);
* ``oasr_<layout>_<config>`` for every lane config and ``auto``, both layouts, SiLU fused, fp32 weights (a folded
  BatchNorm).

Method: benchmarks/scaled_mm.py's `time_graph` (a CUDA graph of >= 16 calls, median of --reps replays), inputs
rotating through enough copies to exceed L2 twice (cold). Numerics: each oasr output vs the fp32 reference, max
|diff| / max |ref| (flagged over 1e-2). Writes JSON: per shape the µs of every variant, speedups of the best
oasr config and of ``auto`` over cudnn_btc / cudnn_bct, and the numerics.
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
import torch.nn.functional as F  # noqa: E402

from scaled_mm import n_copies, time_graph  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def census_shapes(widths: list[int]) -> list[tuple[int, int, int]]:
    """(B, T', C) of every census key with traffic, for each width, plus the measured 8 s batch."""
    from examples.conformer import output_frames

    bts: set[tuple[int, int]] = {(8, 200)}
    for size in "SML":
        p = ROOT / "benchmarks" / "census" / f"conformer_{size}_offline.json"
        if p.is_file():
            for k in json.loads(p.read_text()).get("keys", []):
                if k.get("traffic", 0) > 0 and output_frames(k["frames"]) > 0:
                    bts.add((int(k["batch"]), output_frames(int(k["frames"]))))
    return [(b, t, c) for c in widths for b, t in sorted(bts)]


def run(args) -> dict:
    import oasr_ops  # noqa: F401
    from oasr_ops.families.conv1d import ops
    from oasr_ops.runtime.arch import current_arch_family

    arch = current_arch_family()
    lane = ops.native_lane(arch)
    configs = [c.id for c in lane.space] + ["auto"]
    rows = []
    for dt_name in args.dtypes:
        dtype = DTYPES[dt_name]
        for kw in args.kws:
            for b, t, c in census_shapes(args.widths):
                nbytes = b * t * c * 2
                copies = n_copies(nbytes)
                x_bct = [torch.randn(b, c, t, device="cuda", dtype=dtype) for _ in range(copies)]
                x_btc = [x.transpose(1, 2).contiguous() for x in x_bct]
                w = torch.randn(c, 1, kw, device="cuda") / kw ** 0.5
                bias = torch.randn(c, device="cuda")
                wh, bh = w.to(dtype), bias.to(dtype)
                ref = F.silu(F.conv1d(x_bct[0].float(), w, bias, padding=kw // 2, groups=c))
                row = {"dtype": dt_name, "B": b, "T": t, "C": c, "Kw": kw, "bytes": 2 * nbytes, "us": {}, "err": {}}
                us = row["us"]
                us["cudnn_bct"] = time_graph(
                    lambda i: F.silu(F.conv1d(x_bct[i], wh, bh, padding=kw // 2, groups=c)), copies, reps=args.reps)
                us["cudnn_btc"] = time_graph(
                    lambda i: F.silu(F.conv1d(x_btc[i].transpose(1, 2), wh, bh, padding=kw // 2, groups=c))
                    .transpose(1, 2).contiguous(), copies, reps=args.reps)
                us["transpose_roundtrip"] = time_graph(
                    lambda i: x_btc[i].transpose(1, 2).contiguous().transpose(1, 2).contiguous(), copies,
                    reps=args.reps)
                for layout, xs in (("bct", x_bct), ("btc", x_btc)):
                    for cfg in configs:
                        name = f"oasr_{layout}_{cfg}"
                        try:
                            y = ops.conv1d_depthwise(xs[0], w, bias, layout=layout, activation="silu", config=cfg)
                            yb = y if layout == "bct" else y.transpose(1, 2)
                            row["err"][name] = float((yb.float() - ref).abs().max() / ref.abs().max())
                            us[name] = time_graph(lambda i, xs=xs, layout=layout, cfg=cfg: ops.conv1d_depthwise(
                                xs[i], w, bias, layout=layout, activation="silu", config=cfg), copies, reps=args.reps)
                        except Exception as e:  # record and go on: one broken config must not lose the sweep
                            row["err"][name] = f"{type(e).__name__}: {e}"
                for layout in ("bct", "btc"):
                    mine = {k: v for k, v in us.items() if k.startswith(f"oasr_{layout}_") and not k.endswith("auto")}
                    if mine:
                        best = min(mine, key=mine.get)
                        row[f"best_{layout}"] = best
                        row[f"speedup_best_{layout}_vs_cudnn_btc"] = us["cudnn_btc"] / mine[best]
                        row[f"speedup_best_{layout}_vs_cudnn_bct"] = us["cudnn_bct"] / mine[best]
                    auto = us.get(f"oasr_{layout}_auto")
                    if auto:
                        row[f"speedup_auto_{layout}_vs_cudnn_btc"] = us["cudnn_btc"] / auto
                        row[f"speedup_auto_{layout}_vs_cudnn_bct"] = us["cudnn_bct"] / auto
                row["flagged"] = [k for k, v in row["err"].items() if not isinstance(v, float) or v > 1e-2]
                rows.append(row)
                print(f"{dt_name} Kw={kw} B={b} T={t} C={c}: cudnn_btc {us['cudnn_btc']:.1f} us, cudnn_bct "
                      f"{us['cudnn_bct']:.1f}, auto btc {us.get('oasr_btc_auto', float('nan')):.1f} bct "
                      f"{us.get('oasr_bct_auto', float('nan')):.1f}, best btc {row.get('best_btc')} "
                      f"{us.get(row.get('best_btc', ''), float('nan')):.1f}"
                      + (f"  FLAGGED {row['flagged']}" if row["flagged"] else ""), flush=True)
    return {"device": torch.cuda.get_device_name(), "arch": arch, "torch": torch.__version__, "lane": lane.name,
            "configs": configs, "reps": args.reps, "rows": rows, "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--kws", type=int, nargs="+", default=[15, 31])
    ap.add_argument("--widths", type=int, nargs="+", default=[256, 512, 768, 1024])
    ap.add_argument("--dtypes", nargs="+", default=["fp16"], choices=sorted(DTYPES))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/conv1d.py needs a CUDA GPU", file=sys.stderr)
        return 2
    out = run(args)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out} ({len(out['rows'])} shapes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Batched GEMM (`oasr::bmm`) on the GPU: every config of the native bmm lane vs cuBLAS (`torch.bmm`) at the
attention shapes of the reference Conformers with relative-position attention (examples/conformer.py
``attention="rel_pos"``), both B layouts.

    python benchmarks/bmm.py --out bmm.json [--reps 9]

Shapes: L = batch x heads, head dim 64; T (encoder frames) in --ts (multiples of 8: the kernels need N % 8 ==
K % 8 == 0). Per T: scores ``(q + u) @ k^T`` (M = T, N = T, K = 64; B K-major when k^T is a view, N-major when
the graph materialises it) and ``attn @ v`` (M = T, N = 64, K = T, B N-major). Method: benchmarks/scaled_mm.py's
`time_graph` (a CUDA graph of >= 16 calls, median of --reps replays); operands rotate through enough copies to
exceed L2 twice (cold). Numerics: every config's output vs cuBLAS's, max |diff| / max |ref| (fp32 accumulation
both; reported, and configs over 1e-2 are flagged).
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

from scaled_mm import n_copies, time_graph  # noqa: E402


def problems(ls: list[int], ts: list[int], hd: int):
    for el in ls:
        for t in ts:
            yield ("scores", el, t, t, hd, "k")
            yield ("scores", el, t, t, hd, "n")
            yield ("attn_v", el, t, hd, t, "n")


def operands(el, m, n, k, major, dtype, copies):
    a = [torch.randn(el, m, k, device="cuda", dtype=dtype) for _ in range(copies)]
    if major == "k":
        b = [torch.randn(el, n, k, device="cuda", dtype=dtype).transpose(1, 2) for _ in range(copies)]
    else:
        b = [torch.randn(el, k, n, device="cuda", dtype=dtype) / k ** 0.5 for _ in range(copies)]
    return a, b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ls", default="32,128", help="batch x heads values (Conformer M: 8 heads; B=4, 16)")
    ap.add_argument("--ts", default="128,256,512,1024,1504")
    ap.add_argument("--hd", type=int, default=64)
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args()

    import oasr_ops  # noqa: F401
    from oasr_ops.codegen.jit import JitSpec, build_many
    from oasr_ops.runtime.registry import native_lane
    from oasr_ops.families.bmm.lanes import kernel_variant
    from oasr_ops.runtime.arch import current_arch_family

    arch = current_arch_family()
    lane = native_lane(arch, "bmm")
    if lane is None:
        print(f"no bmm lane on {arch}", file=sys.stderr)
        return 1
    t0 = time.monotonic()
    rep = build_many([JitSpec.for_kernel(lane, c, kernel_variant("fp16", mj), arch)
                      for c in lane.space for mj in ("k", "n")])
    print(rep.summary().splitlines()[0], file=sys.stderr)
    dtype = torch.float16
    rows = []
    for kind, el, m, n, k, major in problems([int(x) for x in a.ls.split(",")], [int(x) for x in a.ts.split(",")],
                                             a.hd):
        copies = n_copies(2 * el * (m * k + k * n))
        A, B = operands(el, m, n, k, major, dtype, copies)
        ref = torch.bmm(A[0].double(), B[0].double())
        res = {"kind": kind, "L": el, "M": m, "N": n, "K": k, "b_major": major, "us": {}, "err": {}}
        for cfg in ["torch", *lane.ids()]:
            out = torch.ops.oasr.bmm(A[0], B[0], cfg)
            res["err"][cfg] = ((out.double() - ref).abs().max() / ref.abs().max()).item()
            res["us"][cfg] = time_graph(lambda i, c=cfg: torch.ops.oasr.bmm(A[i], B[i], c), copies, reps=a.reps)
        best = min((c for c in res["us"] if c != "torch"), key=res["us"].get)
        res["best"] = best
        res["speedup_best_vs_cublas"] = res["us"]["torch"] / res["us"][best]
        bad = [c for c, e in res["err"].items() if e > 1e-2]
        print(f"{kind:6s} L={el:4d} M={m:5d} N={n:5d} K={k:5d} B {major}-major: cuBLAS {res['us']['torch']:8.2f} us, "
              f"best {best} {res['us'][best]:8.2f} us ({res['speedup_best_vs_cublas']:.3f}x)"
              + (f"  ERR>1e-2: {bad}" if bad else ""), flush=True)
        rows.append(res)
        A = B = None  # free this shape's operands before the next one
        torch.cuda.empty_cache()
    served = sorted({(p.signature, p.config) for p in sys.modules["oasr_ops.families.bmm.ops"].served()})
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "lane": lane.name, "method": "CUDA graph of >= 16 calls, median of replays, cold operands",
           "wall_s": time.monotonic() - t0, "rows": rows, "served": served}
    Path(a.out).write_text(json.dumps(doc, indent=1))
    import math
    g = math.exp(sum(math.log(r["speedup_best_vs_cublas"]) for r in rows) / len(rows))
    print(f"geomean best-config vs cuBLAS: {g:.3f}x over {len(rows)} shapes; wall {doc['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

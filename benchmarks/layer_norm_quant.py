"""oasr::layer_norm_quant: every launch config per width vs the unfused paths, on the GPU (issue 15).

  python benchmarks/layer_norm_quant.py --out lnq.json

Per width N (the LayerNorm widths of the ASR encoders: 144, 256, 512, 768, 1024, 1280) and M (rows = B x T):
  lnq_r*_v*       the fused kernel with that config (fp16 in, int8 + fp32 scale out; normalized=False)
  inductor        torch.compile of F.layer_norm -> oasr.quantize_per_token (what the backend ran before:
                  Inductor fuses both into one Triton kernel per shape)
  layer_norm      F.layer_norm alone, fp16 out (the pass the fp16 model pays anyway)
Time: a CUDA graph of 20 calls replayed --iters times, median per call (kernel time, no dispatch); GB/s counts x read once, q and the scale
written once. Prints the fastest config per width and the `AUTO_BY_WIDTH` table it implies
(oasr_ops/families/layer_norm_quant/ops.py), writes everything to --out.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")


def time_us(fn, iters: int) -> float:
    """Median µs per call of `fn`, from a CUDA graph of 20 calls replayed `iters` times (`scaled_mm.time_graph`):
    the GPU time of the kernels alone. Timing one eager call between two events measured the op's Python
    dispatch (~20 µs) instead of a ~3 µs kernel."""
    from scaled_mm import time_graph

    return time_graph(lambda _i: fn(), 1, calls=20, reps=iters)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--widths", default="144,256,512,768,1024,1280")
    p.add_argument("--ms", default="4000,16000")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--out", required=True)
    a = p.parse_args()

    import oasr_ops
    from oasr_ops.codegen.jit import build_many
    from oasr_ops.codegen.render_layer_norm_quant import SPACE
    from oasr_ops.families.layer_norm_quant.kernels import cuda_arch_of, spec_for

    dev = torch.device("cuda")
    torch._dynamo.config.cache_size_limit = 64  # one compile per shape of the compiled baselines
    t0 = time.perf_counter()
    rep = build_many([spec_for(c, torch.float16, "int8", cuda_arch_of(dev)) for c in SPACE], progress=False)
    print(f"built in {time.perf_counter() - t0:.0f}s: {rep.summary()}", flush=True)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "iters": a.iters, "rows": []}
    unfused = torch.compile(lambda x, w, b: torch.ops.oasr.quantize_per_token(
        torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, 1e-5)), dynamic=False)
    best: dict[int, dict[str, float]] = {}
    for n in (int(v) for v in a.widths.split(",")):
        for m in (int(v) for v in a.ms.split(",")):
            x = torch.randn(m, n, device=dev, dtype=torch.float16)
            w = torch.rand(n, device=dev, dtype=torch.float16) + 0.5
            b = torch.randn(n, device=dev, dtype=torch.float16)
            gb = (m * n * 2 + m * n + m * 4) / 1e9
            row = {"N": n, "M": m, "us": {}}
            for c in SPACE:
                if n > c.max_width:
                    continue
                row["us"][c.id] = time_us(lambda c=c: oasr_ops.layer_norm_quant(x, w, b, config=c.id), a.iters)
            row["us"]["inductor"] = time_us(lambda: unfused(x, w, b), a.iters)
            row["us"]["layer_norm"] = time_us(lambda: torch.nn.functional.layer_norm(x, (n,), w, b), a.iters)
            fused = {k: v for k, v in row["us"].items() if k.startswith("lnq_")}
            win = min(fused, key=fused.get)
            row["best"], row["best_gbps"] = win, gb / (fused[win] / 1e6)
            row["speedup_vs_inductor"] = row["us"]["inductor"] / fused[win]
            for k, v in fused.items():
                best.setdefault(n, {}).setdefault(k, 0.0)
                best[n][k] += v
            res["rows"].append(row)
            print(f"N={n:5d} M={m:6d}  best {win} {fused[win]:7.1f} us ({row['best_gbps']:.0f} GB/s)  "
                  f"auto-table {_auto(n)}  "
                  f"inductor {row['us']['inductor']:7.1f} us  layer_norm {row['us']['layer_norm']:7.1f} us  "
                  f"x{row['speedup_vs_inductor']:.2f} vs inductor", flush=True)
    res["best_by_width"] = {n: min(v, key=v.get) for n, v in best.items()}  # summed over the Ms
    print("suggested AUTO_BY_WIDTH:", res["best_by_width"], flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


def _auto(n: int) -> str:
    from oasr_ops.families.layer_norm_quant.ops import auto_config

    c = auto_config(n)
    return c.id if c else "reference"


if __name__ == "__main__":
    raise SystemExit(main())

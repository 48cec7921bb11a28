"""The Conv2dSubsampling frontend's convs (`oasr::conv2d_activation`) on the GPU vs cuDNN as Inductor runs them,
per conv and for the whole frontend module compiled with backend oasr vs inductor.

    python benchmarks/conv2d.py --out conv2d.json [--shapes C:B:FRAMES ...] [--reps 7] [--module-shapes ...]

Shapes (default): C = d_model of Conformer S/M/L (256/512/1024) x (B, frames) in (8, 300), (16, 1027) (the
profiled Conformer M call), (32, 1000), (8, 3000); 80 mel bins. Per shape, fp16:

* conv1 = Conv2d(1, C, 3, stride 2) + ReLU on ``feats.unsqueeze(1)``:
  ``cudnn_nchw`` relu(F.conv2d) on the NCHW tensor, what Inductor runs (its ReLU is a separate Triton pass);
  ``cudnn_nhwc`` the op's ``torch`` arm (F.conv2d on channels_last views + in-place ReLU, packed NHWC out);
  ``cudnn_nhwc_fused`` the ``fused`` arm (torch.cudnn_convolution_relu: cuDNN's conv + bias + ReLU fusion);
  ``oasr_<config>`` for every direct-conv config and ``oasr_auto`` (the untuned rule).
* conv2 = Conv2d(C, C, 3, stride 2) + ReLU on conv1's output:
  ``cudnn_nchw`` relu(F.conv2d) on the NCHW tensor (cuDNN's NHWC kernel + its nhwcToNchw conversion, then ReLU);
  ``cudnn_nhwc`` the torch arm on NHWC; ``oasr_<config>`` for every CUTLASS implicit-GEMM config (2.x ``b...`` and,
  on sm90, 3.x ``t..._ws``), ``oasr_auto``.
Each variant is one op timed as a CUDA graph (benchmarks/scaled_mm.py's `time_graph`: median of --reps replays);
numerics: max |y - ref| / max |ref| vs the fp32 conv (TF32 off), flagged above 1e-2. Reported: µs, TFLOP/s of
conv2, the best oasr config and its speedup over cudnn_nchw / cudnn_nhwc, and the frontend's sum over both convs.

Module (``--module-shapes``, default C=512 B=16 frames=1027 and C=256 B=32 frames=1000):
examples.conformer.Conv2dSubsampling4(80, C, C) in fp16, torch.compile(mode="reduce-overhead") with backend
inductor vs oasr, --rounds alternating rounds of 20 calls each (median per round, then the median of rounds),
error vs the fp32 module, the oasr sites (config and tier per conv), and each backend's kernel-time profile
(torch.profiler, compiled without CUDA graphs, 5 calls).
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from conv_module import kernel_profile  # noqa: E402
from scaled_mm import time_graph  # noqa: E402

DEFAULT_SHAPES = [f"{c}:{b}:{f}" for c in (256, 512, 1024) for b, f in ((8, 300), (16, 1027), (32, 1000), (8, 3000))]
DEFAULT_MODULE = ["512:16:1027", "256:32:1000"]
MELS = 80


def parse_shape(s: str) -> tuple[int, int, int]:
    c, b, f = (int(v) for v in s.split(":"))
    return c, b, f


def ref_conv(x_nchw, w, b, stride):
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        return torch.relu(F.conv2d(x_nchw.float(), w.float(), b.float(), stride=stride))


def err(y_nhwc, ref_nchw) -> float:
    r = ref_nchw.permute(0, 2, 3, 1)
    return float((y_nhwc.float() - r).abs().max() / r.abs().max().clamp(min=1e-6))


def bench_conv(name: str, x_nchw, w, b, configs: list[str], reps: int, calls: int) -> dict:
    """One conv + ReLU: cuDNN on NCHW (Inductor's), the torch arm on NHWC, every oasr config."""
    from oasr_ops.families.conv2d_activation import ops

    x_nhwc = x_nchw.permute(0, 2, 3, 1).contiguous()
    w_krsc = w.permute(0, 2, 3, 1).contiguous()
    ref = ref_conv(x_nchw, w, b, 2)
    ops.reset_plans()  # `served` below: this conv's plans only
    us: dict[str, float] = {}
    errs: dict[str, object] = {}
    us["cudnn_nchw"] = time_graph(lambda i: torch.relu(F.conv2d(x_nchw, w, b, stride=2)), 1, calls=calls, reps=reps)
    for cfg in ["torch", "fused", *configs, "auto"]:
        key = {"torch": "cudnn_nhwc", "fused": "cudnn_nhwc_fused"}.get(cfg, f"oasr_{cfg}")
        try:
            y = ops.conv2d_activation(x_nhwc, w_krsc, b, stride=(2, 2), activation="relu", config=cfg)
            errs[key] = err(y, ref)
            us[key] = time_graph(lambda i, cfg=cfg: ops.conv2d_activation(x_nhwc, w_krsc, b, stride=(2, 2),
                                                                          activation="relu", config=cfg),
                                 1, calls=calls, reps=reps)
        except Exception as e:  # record and go on: one broken config must not lose the sweep
            errs[key] = f"{type(e).__name__}: {e}"
    served = {p.signature: p.config for p in ops.served()}
    mine = {k: v for k, v in us.items() if k.startswith("oasr_") and k != "oasr_auto"}
    row = {"conv": name, "x": list(x_nchw.shape), "w": list(w.shape), "us": us, "err": errs}
    if mine:
        best = min(mine, key=mine.get)
        row.update(best=best, best_us=mine[best], speedup_best_vs_cudnn_nchw=us["cudnn_nchw"] / mine[best],
                   speedup_best_vs_cudnn_nhwc=us["cudnn_nhwc"] / mine[best] if "cudnn_nhwc" in us else None)
    if "oasr_auto" in us:
        row["speedup_auto_vs_cudnn_nchw"] = us["cudnn_nchw"] / us["oasr_auto"]
    row["served"] = served
    row["flagged"] = [k for k, v in errs.items() if not isinstance(v, float) or v > 1e-2]
    return row


def run_shapes(args) -> list[dict]:
    from examples.conformer import output_frames
    from oasr_ops.families.conv2d_activation import ops

    lane = ops.native_lane(_arch())
    direct = [c.id for c in lane.space if c.generation == "dc"]
    igemm = [c.id for c in lane.space if c.generation in ("2x", "3x")]
    rows = []
    for s in args.shapes:
        c, bsz, frames = parse_shape(s)
        g = torch.Generator(device="cuda").manual_seed(0)
        feats = torch.randn(bsz, frames, MELS, device="cuda", dtype=torch.float16, generator=g)
        w1 = (torch.randn(c, 1, 3, 3, device="cuda", generator=g) / 3).half()
        b1 = torch.randn(c, device="cuda", generator=g).half() * 0.1
        w2 = (torch.randn(c, c, 3, 3, device="cuda", generator=g) / (3 * c ** 0.5)).half()
        b2 = torch.randn(c, device="cuda", generator=g).half() * 0.1
        x1 = feats.unsqueeze(1)
        y1 = torch.relu(F.conv2d(x1, w1, b1, stride=2)).contiguous()
        m2 = bsz * output_frames(frames) * (((MELS - 1) // 2 - 1) // 2)
        calls = 16 if m2 * c * c * 9 < 2e11 else 4
        r1 = bench_conv("conv1", x1, w1, b1, direct, args.reps, calls)
        r2 = bench_conv("conv2", y1, w2, b2, igemm, args.reps, calls)
        flop2 = 2.0 * m2 * c * c * 9
        r2["tflops"] = {k: flop2 / (v * 1e-6) / 1e12 for k, v in r2["us"].items()}
        front = {"cudnn_nchw": r1["us"]["cudnn_nchw"] + r2["us"]["cudnn_nchw"]}
        if "best_us" in r1 and "best_us" in r2:
            front["oasr_best"] = r1["best_us"] + r2["best_us"]
        if "oasr_auto" in r1["us"] and "oasr_auto" in r2["us"]:
            front["oasr_auto"] = r1["us"]["oasr_auto"] + r2["us"]["oasr_auto"]
        rows.append({"C": c, "B": bsz, "frames": frames, "conv1": r1, "conv2": r2, "frontend_us": front})
        print(f"C={c} B={bsz} frames={frames}: conv1 cudnn {r1['us']['cudnn_nchw']:.1f} us, nhwc "
              f"{r1['us'].get('cudnn_nhwc', float('nan')):.1f}, best {r1.get('best')} {r1.get('best_us', 0):.1f}, "
              f"auto {r1['us'].get('oasr_auto', float('nan')):.1f} | conv2 cudnn {r2['us']['cudnn_nchw']:.1f} us, "
              f"nhwc {r2['us'].get('cudnn_nhwc', float('nan')):.1f}, best {r2.get('best')} "
              f"{r2.get('best_us', 0):.1f} ({r2['tflops'].get(r2.get('best', ''), 0):.0f} TFLOP/s), auto "
              f"{r2['us'].get('oasr_auto', float('nan')):.1f} | frontend {front}"
              + (f"  FLAGGED {r1['flagged'] + r2['flagged']}" if r1["flagged"] or r2["flagged"] else ""),
              flush=True)
        del feats, x1, y1
        torch.cuda.empty_cache()
    return rows


def _arch():
    from oasr_ops.runtime.arch import current_arch_family

    return current_arch_family()


def run_module(args) -> list[dict]:
    from examples import conformer
    from oasr_ops.inductor import rewrite as rw
    from oasr_ops.inductor.backend import oasr_backend

    out = []
    for s in args.module_shapes:
        c, bsz, frames = parse_shape(s)
        torch.manual_seed(0)
        m = conformer.Conv2dSubsampling4(MELS, c, c).eval().cuda()
        x = torch.randn(bsz, frames, MELS, device="cuda")
        with torch.no_grad():
            ref = m(x)
            mh, xh = m.half(), x.half()
            fns, errs, sites = {}, {}, []
            torch.compiler.reset()
            for backend in ("inductor", "oasr"):  # one copy of the module per backend, no reset between
                rw.clear_rewrite_log()
                with torch._inductor.config.patch(fx_graph_cache=False):  # the pass runs: its sites are read
                    fn = torch.compile(copy.deepcopy(mh), backend=oasr_backend if backend == "oasr" else backend,
                                       mode="reduce-overhead", dynamic=False)
                    for _ in range(3):
                        y = fn(xh)
                torch.cuda.synchronize()
                errs[backend] = float((y.float() - ref).abs().max() / ref.abs().max())
                if backend == "oasr":
                    sites = [s.as_dict() for r in rw.rewrite_log() for s in r.sites]
                fns[backend] = fn
            rounds: dict[str, list[float]] = {b: [] for b in fns}
            for _ in range(args.rounds):
                for backend, fn in fns.items():
                    ts = []
                    for _ in range(20):
                        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        st.record()
                        fn(xh)
                        en.record()
                        en.synchronize()
                        ts.append(st.elapsed_time(en) * 1000)
                    rounds[backend].append(statistics.median(ts))
            profiles = {}
            for backend in ("inductor", "oasr"):  # kernel time without CUDA graphs: every kernel is the frontend's
                with torch._inductor.config.patch(fx_graph_cache=False):
                    fn = torch.compile(copy.deepcopy(mh), backend=oasr_backend if backend == "oasr" else backend,
                                       dynamic=False)
                    profiles[backend] = kernel_profile(fn, xh, 5, top=12)
        med = {b: statistics.median(v) for b, v in rounds.items()}
        row = {"C": c, "B": bsz, "frames": frames, "us": med, "rounds_us": rounds, "err": errs, "sites": sites,
               "speedup_oasr_vs_inductor": med["inductor"] / med["oasr"],
               "kernel_us": {b: p[0] for b, p in profiles.items()}, "kernels": {b: p[1] for b, p in profiles.items()}}
        out.append(row)
        print(f"module C={c} B={bsz} frames={frames}: inductor {med['inductor']:.1f} us, oasr {med['oasr']:.1f} us "
              f"({row['speedup_oasr_vs_inductor']:.2f}x), err {errs}, sites "
              f"{[(s['op'], s['k'], s['config'], s['tier']) for s in sites]}", flush=True)
        for b, (total, rows) in profiles.items():
            print(f"  {b} kernel time {total:.1f} us: " + "; ".join(f"{r['kernel'][:60]} {r['us_per_iter']:.1f}"
                                                              for r in rows[:6]), flush=True)
        del fns
        torch.compiler.reset()
        torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", nargs="*", default=DEFAULT_SHAPES, help="C:B:FRAMES")
    ap.add_argument("--module-shapes", nargs="*", default=DEFAULT_MODULE, help="C:B:FRAMES")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/conv2d.py needs a CUDA GPU", file=sys.stderr)
        return 2
    import oasr_ops  # noqa: F401

    res = {"device": torch.cuda.get_device_name(), "arch": _arch(), "torch": torch.__version__,
           "time": time.strftime("%Y-%m-%d %H:%M:%S"), "reps": args.reps}
    res["shapes"] = run_shapes(args)
    args.out.write_text(json.dumps(res, indent=1))
    res["module"] = run_module(args)
    args.out.write_text(json.dumps(res, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

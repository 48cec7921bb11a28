"""The Conformer convolution module alone: torch.compile(backend="inductor") vs backend="oasr", both conv forms.

    python benchmarks/conv_module.py --size M --batch 16 --frames 1000 --out conv_module.json

One module of examples/conformer.py (``Conv1dConvolutionModule``, conv_impl="conv1d": LayerNorm -> transpose ->
Conv1d(d, 2d, 1) -> GLU -> depthwise Conv1d(k) -> BatchNorm1d -> SiLU -> Conv1d(d, d, 1) -> transpose; and the
Linear form ``ConvolutionModule``), fp16, eval, random BatchNorm statistics, on x [B, T', d] with T' the encoder
frames of --frames input frames (the subsampling's output_frames). Per form and backend:

* latency: mode="reduce-overhead" (CUDA graphs), one module copy per backend, --rounds alternating rounds (the
  order flips every round), each the median of --iters calls timed with CUDA events; the reported figure is the
  median over rounds;
* kernel time: torch.profiler over --profile-iters calls compiled WITHOUT CUDA graphs (so the profiler sees every
  kernel), the sum of device time per call and the kernels by time — every kernel here is the conv module's;
* numerics: max |out - ref| / max |ref| vs the fp32 eager module;
* the oasr pass's sites (family, N, K, config, tier) and the convolutions it left on aten, with the reason.

The issue's goal is read off ``kernel_speedup`` (inductor kernel us / oasr kernel us, >= 2x) per form.
Writes JSON (--out) and prints a table. Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BACKENDS = ("inductor", "oasr")


def build(form: str, size: str, seed: int = 0):
    from examples import conformer

    cfg = conformer.config_for(size, conv_impl=form)
    torch.manual_seed(seed)
    cls = conformer.Conv1dConvolutionModule if form == "conv1d" else conformer.ConvolutionModule
    m = cls(cfg).eval()
    bn = getattr(m, "conv_norm", None)
    if isinstance(bn, torch.nn.BatchNorm1d):
        with torch.no_grad():
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
    return m, cfg.d_model


def compiled(m, backend: str, graphs: bool):
    from oasr_ops.inductor.backend import oasr_backend

    be = oasr_backend if backend == "oasr" else backend
    return torch.compile(m, backend=be, mode="reduce-overhead" if graphs else None, dynamic=False)


def time_round(fn, x, iters: int) -> float:
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(x)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    return statistics.median(ts)


def kernel_profile(fn, x, iters: int, top: int = 25) -> tuple[float, list[dict]]:
    """(kernel µs per call, the `top` kernels) of `fn(x)` under torch.profiler (no CUDA graphs)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn(x)
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t > 0:
            rows.append({"kernel": ev.key[:120], "calls_per_iter": ev.count / iters, "us_per_iter": t / iters})
    rows.sort(key=lambda r: -r["us_per_iter"])
    return sum(r["us_per_iter"] for r in rows), rows[:top]


def run_form(form: str, a) -> dict:
    import oasr_ops
    from examples.conformer import output_frames
    from oasr_ops.inductor.rewrite import clear_rewrite_log, rewrite_log

    m32, d = build(form, a.size)
    m32 = m32.cuda()
    t = output_frames(a.frames)
    x = torch.randn(a.batch, t, d, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad():
        ref = m32(x)
    m16 = build(form, a.size)[0].cuda().half()
    xh = x.half()
    res: dict = {"form": form, "B": a.batch, "T": t, "d": d, "latency_us": {}, "rounds_us": {}, "err": {},
                 "kernel_us": {}, "kernels": {}}
    fns = {}
    torch.compiler.reset()
    oasr_ops.reload_tuning()
    with torch.no_grad():
        for be in BACKENDS:  # one copy of the module per backend (as benchmarks/e2e_compare.py), no reset between
            clear_rewrite_log()
            with torch._inductor.config.patch(fx_graph_cache=False):  # the pass runs: its sites are read
                fn = compiled(copy.deepcopy(m16), be, graphs=True)
                for _ in range(3):
                    out = fn(xh)
            torch.cuda.synchronize()
            res["err"][be] = float((out.float() - ref).abs().max() / ref.abs().max())
            if be == "oasr":
                res["sites"] = [{"family": s.family, "n": s.n, "k": s.k, "config": s.config, "tier": s.tier}
                                for r in rewrite_log() for s in r.sites]
                res["left_on_aten"] = [why for r in rewrite_log() for _, why in r.skipped if "conv" in why]
            fns[be] = fn
        # alternate the backends round by round, the order flipping every round
        for be in BACKENDS:
            res["rounds_us"][be] = []
        for r in range(a.rounds):
            for be in (BACKENDS if r % 2 == 0 else BACKENDS[::-1]):
                res["rounds_us"][be].append(time_round(fns[be], xh, a.iters))
        for be in BACKENDS:
            res["latency_us"][be] = statistics.median(res["rounds_us"][be])
        del fns
        for be in BACKENDS:
            torch.compiler.reset()
            fn = compiled(copy.deepcopy(m16), be, graphs=False)
            total, rows = kernel_profile(fn, xh, a.profile_iters)
            res["kernel_us"][be], res["kernels"][be] = total, rows
            print(f"  {form} {be}: kernels {total:.1f} us per call (no CUDA graphs)", flush=True)
            for row in rows[:12]:
                print(f"      {row['us_per_iter']:8.1f} us  {row['calls_per_iter']:4.1f}x  {row['kernel']}")
    res["speedup"] = res["latency_us"]["inductor"] / res["latency_us"]["oasr"]
    res["kernel_speedup"] = res["kernel_us"]["inductor"] / res["kernel_us"]["oasr"]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="M")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--frames", type=int, default=1000)
    ap.add_argument("--forms", default="conv1d,linear")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--profile-iters", type=int, default=10)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/conv_module.py needs a CUDA GPU", file=sys.stderr)
        return 2
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "size": a.size, "rounds": a.rounds, "iters": a.iters, "forms": []}
    for form in a.forms.split(","):
        print(f"{form}: compiling and timing", flush=True)
        r = run_form(form, a)
        out["forms"].append(r)
        a.out.write_text(json.dumps(out, indent=1))  # partial results survive a later failure
    print(f"\n{'form':8} {'B x T x d':>14} {'inductor us':>12} {'oasr us':>9} {'speedup':>8} {'kern ind':>9} "
          f"{'kern oasr':>9} {'kern x':>7} {'err oasr':>9}")
    for r in out["forms"]:
        print(f"{r['form']:8} {r['B']:>4}x{r['T']}x{r['d']:<5} {r['latency_us']['inductor']:12.1f} "
              f"{r['latency_us']['oasr']:9.1f} {r['speedup']:7.2f}x {r['kernel_us']['inductor']:9.1f} "
              f"{r['kernel_us']['oasr']:9.1f} {r['kernel_speedup']:6.2f}x {r['err']['oasr']:9.2e}")
        if r.get("left_on_aten"):
            print(f"         left on aten: {r['left_on_aten']}")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

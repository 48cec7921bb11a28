"""oasr_ops.autotune() on an eager (NOT compiled) Conformer: tuning time, profiles, eager latency before/after,
a second process on the same cache, and the per-call host overhead of the context.

  python benchmarks/autotune_eager.py --size S --batches 1,2,4,8 --frames 300,600,1000,1500 --out $OUT/autotune.json

The example Conformer (examples/conformer.py build_model / example_inputs) with every nn.Linear running as
``oasr_ops.gemm(x, w, b, config="auto")`` (the selection an eager call gets), run over every (batch, frames):

1. before: eager latency per shape outside the context (the tuning DB's / fallback's selections);
2. tune:   one forward per shape under ``autotune(cache=...)``: wall time, shapes profiled, candidates timed;
3. after:  eager latency per shape inside the context (every bucket tuned);
4. second: this script re-run with ``--second`` in a fresh process on the same cache: it must profile nothing;
5. host:   per-call host time of ``oasr_ops.gemm`` on small shapes (M=16/64, N=K=256/512; GPU keeps up), outside
   ("auto": the DB's config), inside (tuned), and outside with the config the context chose passed explicitly
   (the same kernel without the context): inside - explicit is the context's own overhead (target <= +1 us).
Also the untouched model (nn.Linear -> cuBLAS) as a reference column.

The user tier is redirected to a temporary directory (OASR_TUNE_USER_DB) unless set, so publishing is exercised
without touching the machine's tuning. Latency: median of --iters forwards (perf_counter around a synchronized
forward: the eager host cost is part of what autotune ranks). Nothing is asserted; the JSON is the result.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("OASR_TUNE_USER_DB", tempfile.mkdtemp(prefix="oasr_autotune_user_"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import oasr_ops  # noqa: E402
from examples.conformer import build_model, example_inputs, output_frames  # noqa: E402
from oasr_ops.runtime.select import select_config  # noqa: E402


class OasrLinear(nn.Module):
    """nn.Linear's weights, run as oasr_ops.gemm(config="auto")."""

    def __init__(self, lin: nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = lin.weight, lin.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return oasr_ops.gemm(x.contiguous(), self.weight, self.bias, None, "auto")


def to_oasr(model: nn.Module) -> nn.Module:
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, OasrLinear(child))
        else:
            to_oasr(child)
    return model


def latency_ms(model, x, iters: int) -> float:
    with torch.inference_mode():
        for _ in range(2):
            model(x)
        torch.cuda.synchronize()
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            model(x)
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def shapes(args) -> list[tuple[int, int]]:
    return [(int(b), int(t)) for b in args.batches.split(",") for t in args.frames.split(",")]


def build(args):
    model = build_model(args.size, dtype="fp16", device="cuda", num_layers=args.layers) if args.layers \
        else build_model(args.size, dtype="fp16", device="cuda")
    return model


def run_second(args) -> dict:
    """A fresh process on the same cache: forwards over every shape; reports what it profiled."""
    model = to_oasr(build(args))
    out = {"latency_ms": {}}
    with oasr_ops.autotune(cache=args.cache, space=args.space, publish=False) as t:
        t0 = time.monotonic()
        with torch.inference_mode():
            for b, f in shapes(args):
                (x,) = example_inputs(b, f, dtype="fp16", device="cuda")
                model(x)
        torch.cuda.synchronize()
        out["first_pass_s"] = time.monotonic() - t0
        for b, f in shapes(args):
            (x,) = example_inputs(b, f, dtype="fp16", device="cuda")
            out["latency_ms"][f"{b}x{f}"] = latency_ms(model, x, args.iters)
    out.update(profiles=t.stats.profiles, timed=t.stats.timed, hits=t.stats.hits)
    return out


def host_us(fn, number: int = 2000, repeat: int = 7) -> float:
    fn()
    torch.cuda.synchronize()
    best = min(timeit.repeat(fn, number=number, repeat=repeat))  # min: the least-disturbed repeat
    torch.cuda.synchronize()
    return best / number * 1e6


def host_overhead(args) -> list[dict]:
    rows = []
    for m, n, k in ((16, 256, 256), (64, 512, 512), (16, 1024, 256)):
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k ** 0.5
        b = torch.randn(n, device="cuda", dtype=torch.float16)
        gemm = torch.ops.oasr.gemm.default
        outside = host_us(lambda: gemm(a, w, b, "none", "auto"))
        with oasr_ops.autotune(cache=args.cache, space=args.space, publish=False):
            gemm(a, w, b, "none", "auto")  # profiles (or hits the cache)
            chosen = select_config("gemm", "gemm", "fp16", n, k, m).config
            inside = host_us(lambda: gemm(a, w, b, "none", "auto"))
        explicit = host_us(lambda: gemm(a, w, b, "none", chosen))
        rows.append({"m": m, "n": n, "k": k, "chosen": chosen, "outside_auto_us": outside, "inside_us": inside,
                     "outside_explicit_chosen_us": explicit, "context_overhead_us": inside - explicit})
    return rows


def prebuild(args) -> dict:
    from oasr_ops.codegen.jit import build_many
    from oasr_ops.runtime import registry
    from oasr_ops.runtime.arch import current_arch_family

    specs = registry.get("gemm").handler("prebuild_specs")(current_arch_family(), True, ("fp16",))
    t0 = time.monotonic()
    rep = build_many(specs, jobs=args.jobs, progress=False)
    return {"specs": len(specs), "s": time.monotonic() - t0, "report": str(rep)[:400]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="S")
    ap.add_argument("--layers", type=int, default=0, help="override the number of blocks (0: the size's)")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--frames", default="300,600,1000,1500")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--space", default="all", choices=("all", "compiled"))
    ap.add_argument("--cache", default=None, help="autotune cache file (default: a fresh temp file)")
    ap.add_argument("--no-prebuild", action="store_true", help="skip JIT-building the gemm space first")
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--second", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("autotune_eager: needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.second:
        print("SECOND " + json.dumps(run_second(args)))
        return 0
    if args.cache is None:
        args.cache = os.path.join(tempfile.mkdtemp(prefix="oasr_autotune_"), "oasr_tune.json")
    res: dict = {"device": torch.cuda.get_device_name(), "size": args.size, "space": args.space,
                 "cache": args.cache, "user_db": os.environ["OASR_TUNE_USER_DB"], "shapes": {}}
    if args.space == "all" and not args.no_prebuild:
        res["prebuild"] = prebuild(args)
        print("prebuild:", res["prebuild"], flush=True)
    ref = build(args)
    model = to_oasr(build(args))
    xs = {(b, f): example_inputs(b, f, dtype="fp16", device="cuda")[0] for b, f in shapes(args)}
    for (b, f), x in xs.items():
        res["shapes"][f"{b}x{f}"] = {"M": b * output_frames(f), "torch_ms": latency_ms(ref, x, args.iters),
                                     "before_ms": latency_ms(model, x, args.iters)}
    del ref
    with oasr_ops.autotune(cache=args.cache, space=args.space) as t:
        t0 = time.monotonic()
        with torch.inference_mode():
            for x in xs.values():
                model(x)
        torch.cuda.synchronize()
        res["tune_wall_s"] = time.monotonic() - t0
        res["profiles"], res["timed"], res["profiling_s"] = t.stats.profiles, t.stats.timed, t.stats.tuning_s
        for (b, f), x in xs.items():
            res["shapes"][f"{b}x{f}"]["after_ms"] = latency_ms(model, x, args.iters)
    res["published"] = t.stats.published
    res["tiers_after"] = oasr_ops.tuning_report()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--second", "--cache", args.cache,
                           "--size", args.size, "--layers", str(args.layers), "--batches", args.batches,
                           "--frames", args.frames, "--iters", str(args.iters), "--space", args.space],
                          capture_output=True, text=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("SECOND ")), None)
    res["second"] = json.loads(line[7:]) if line else {"error": proc.stderr[-2000:]}
    res["host_overhead"] = host_overhead(args)

    print(f"\n{res['device']}  Conformer {args.size}  space={args.space}")
    print(f"tuning: {res['profiles']} shapes profiled, {res['timed']} candidate timings, "
          f"{res['profiling_s']:.1f} s profiling, {res['tune_wall_s']:.1f} s first pass")
    sec = res["second"]
    print(f"second process: {sec.get('profiles')} profiles, {sec.get('hits')} cache hits")
    print(f"{'BxT':>9} {'M':>6} {'torch':>8} {'before':>8} {'after':>8} {'second':>8}  (ms, eager)")
    for key, r in res["shapes"].items():
        print(f"{key:>9} {r['M']:>6} {r['torch_ms']:8.2f} {r['before_ms']:8.2f} {r['after_ms']:8.2f} "
              f"{sec.get('latency_ms', {}).get(key, float('nan')):8.2f}")
    print("host per call (us): M N K chosen | outside auto | inside | outside explicit | context overhead")
    for r in res["host_overhead"]:
        print(f"  {r['m']} {r['n']} {r['k']} {r['chosen']} | {r['outside_auto_us']:.2f} | {r['inside_us']:.2f}"
              f" | {r['outside_explicit_chosen_us']:.2f} | {r['context_overhead_us']:+.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

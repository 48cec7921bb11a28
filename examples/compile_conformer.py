"""The main job: ``torch.compile(Conformer, backend="oasr")`` next to ``backend="inductor"``, then the tuning report.

    python examples/compile_conformer.py                  # GPU: Conformer S, B=2 x 400 frames, bf16, reduce-overhead
    python examples/compile_conformer.py --size M --batch 16 --frames 1000
    python examples/compile_conformer.py --device cpu     # the CPU reference path: quick, timings not meaningful

Each backend compiles the same model in the same mode and runs the same input: the first call's wall time
(compile + first run), then the steady-state latency: --warmup calls, then --iters calls each between two CUDA
events (synchronised after each call), median and 10th-90th percentiles. The error is max |out - ref| against the
same weights run eagerly in fp32, absolute and relative to max |ref|.

On a CPU the oasr ops run their reference implementations and Inductor emits C++; those timings measure a CPU,
not the CUTLASS kernels this package selects. The CPU defaults are a 2-layer model at 200 frames, so the run
stays quick.

The script uses the installed ``oasr_ops`` (``pip install .``; scripts/run_main_job.sh does it): the model file
beside it is loaded from this folder without putting the checkout on ``sys.path``.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch

import oasr_ops


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` as ``examples.<name>`` (the model files use relative imports), from this folder.

    Only this folder is registered as the package ``examples``; the repository root is not added to sys.path,
    so ``oasr_ops`` stays the installed package.
    """
    here = Path(__file__).resolve().parent
    if "examples" not in sys.modules:
        spec = importlib.util.spec_from_file_location("examples", here / "__init__.py",
                                                      submodule_search_locations=[str(here)])
        assert spec is not None and spec.loader is not None
        pkg = importlib.util.module_from_spec(spec)
        sys.modules["examples"] = pkg
        spec.loader.exec_module(pkg)
    mod = importlib.import_module(f"examples.{name}")
    if Path(mod.__file__ or "").resolve() != here / f"{name}.py":
        raise ImportError(f"examples.{name} resolved to {mod.__file__}, not {here / f'{name}.py'}: another "
                          "package named `examples` is importable here")
    return mod


def steady_state_ms(fn: Callable[[torch.Tensor], Any], x: torch.Tensor, warmup: int, iters: int) -> list[float]:
    """Per-call latency in ms after ``warmup`` calls: CUDA events on a GPU, wall time on a CPU."""
    cuda = x.is_cuda
    for _ in range(warmup):
        fn(x)
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(x)
            end.record()
            end.synchronize()  # one call at a time from an idle GPU: the latency a request sees
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn(x)
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def resolve_backend(name: str) -> Any:
    if name != "oasr":
        return name
    try:  # registered by the package's `torch_dynamo_backends` entry point after `pip install`
        torch._dynamo.lookup_backend("oasr")
        return "oasr"
    except Exception:  # oasr_ops importable but not pip-installed (PYTHONPATH): pass the backend itself
        from oasr_ops.inductor.backend import oasr_backend

        return oasr_backend


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--size", default="S", help="Conformer size S | M | L (default: S)")
    p.add_argument("--layers", type=int, default=None,
                   help="override num_layers (default: the size's own; 2 on a CPU)")
    p.add_argument("--batch", type=int, default=2, help="utterances per call (default: 2)")
    p.add_argument("--frames", type=int, default=None, help="input frames, 10 ms each (default: 400; 200 on a CPU)")
    p.add_argument("--dtype", default="bf16", help="fp16 | bf16 (default: bf16)")
    p.add_argument("--mode", default=None, help="torch.compile mode for every backend (default: reduce-overhead "
                                                "on a GPU, the default mode on a CPU)")
    p.add_argument("--backends", default=None,
                   help="comma list from eager, inductor, oasr (default: eager,inductor,oasr on a GPU; eager,oasr on "
                        "a CPU, where Inductor's C++ compile alone takes a minute)")
    p.add_argument("--warmup", type=int, default=None, help="calls before timing (default: 10 on a GPU, 1 on a CPU)")
    p.add_argument("--iters", type=int, default=None, help="timed calls (default: 50 on a GPU, 3 on a CPU)")
    p.add_argument("--dynamic", action="store_true", help="compile once for every batch x time size")
    p.add_argument("--prewarm", action="store_true",
                   help="oasr: TuningConfig(mode='prewarm'), measure uncovered GEMM points first (GPU)")
    p.add_argument("--strict", action="store_true", help="oasr: TuningConfig(strict=True), refuse uncovered points")
    p.add_argument("--attention", default="sdpa", help="sdpa | rel_pos (explicit matmuls: oasr.bmm sites)")
    args = p.parse_args(argv)

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda: torch.cuda.is_available() is False here (a CPU build of torch, or no GPU)")
    backends = [b.strip() for b in (args.backends or ("eager,inductor,oasr" if cuda else "eager,oasr")).split(",")
                if b.strip()]
    unknown = sorted(set(backends) - {"eager", "inductor", "oasr"})
    if unknown or not backends:
        p.error(f"--backends: unknown {unknown}; choose from eager, inductor, oasr")
    layers = args.layers if args.layers is not None else (None if cuda else 2)
    frames = args.frames if args.frames is not None else (400 if cuda else 200)
    dtype = args.dtype
    mode = args.mode or ("reduce-overhead" if cuda else None)
    warmup = args.warmup if args.warmup is not None else (10 if cuda else 1)
    iters = args.iters if args.iters is not None else (50 if cuda else 3)

    conformer = load_example("conformer")
    kw: dict[str, Any] = {"attention": args.attention, **({} if layers is None else {"num_layers": layers})}
    model = conformer.build_model(args.size, dtype=dtype, device=args.device, **kw)
    (x,) = conformer.example_inputs(args.batch, frames, dtype=dtype, device=args.device)
    with torch.inference_mode():  # the same weights (init is seeded on the CPU in fp32), run in fp32
        ref = conformer.build_model(args.size, dtype="fp32", device=args.device, **kw)(x.float())
    where = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"oasr_ops {oasr_ops.__version__} from {Path(oasr_ops.__file__).parent}; torch {torch.__version__}")
    print(f"conformer {args.size} ({len(model.blocks)} layers, attention={args.attention}) {dtype} on {where}: "
          f"input {tuple(x.shape)} -> {tuple(ref.shape)}; mode={mode or 'default'}"
          f"{', dynamic' if args.dynamic else ''}")
    if not cuda:
        print("CPU: the oasr ops run their reference path; the timings below are NOT meaningful for the kernels.")

    tuning = oasr_ops.TuningConfig(mode="prewarm" if args.prewarm else "off", strict=args.strict)
    rows: dict[str, dict[str, float]] = {}
    for name in backends:
        torch.compiler.reset()
        if name == "eager":
            fn: Callable[[torch.Tensor], Any] = model
        elif name == "oasr":
            # torch.compile takes `mode` or `options`, not both: the oasr backend reads the mode from its options.
            fn = torch.compile(model, backend=resolve_backend("oasr"), dynamic=args.dynamic or None,
                               options={"tuning": tuning, "mode": mode})
        else:
            fn = torch.compile(model, backend=name, mode=mode, dynamic=args.dynamic or None)
        with torch.inference_mode():
            t0 = time.perf_counter()
            fn(x)
            if cuda:
                torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            times = steady_state_ms(fn, x, warmup, iters)
            # A copy: under CUDA graphs the next replay overwrites the output buffer.
            out = fn(x).to(torch.float32, copy=True)
        err = (out - ref).abs().max().item()
        rows[name] = {"first_s": first_s, "median": statistics.median(times), "p10": percentile(times, 0.1),
                      "p90": percentile(times, 0.9), "err": err, "rel": err / max(ref.abs().max().item(), 1e-30)}

    print()
    print("latency per call, ms: " + ("CUDA events, one call at a time" if cuda else "wall time on a CPU (not meaningful)")
          + f", median and p10-p90 of {iters} calls after {warmup} warm-up calls")
    print(f"{'backend':9s} {'compile+1st call':>16s} {'median':>9s} {'p10-p90':>17s} {'max|err| vs fp32':>17s} "
          f"{'relative':>9s}")
    for name, r in rows.items():
        first = "-" if name == "eager" else f"{r['first_s']:.1f} s"
        spread = f"{r['p10']:.3f}-{r['p90']:.3f}"
        print(f"{name:9s} {first:>16s} {r['median']:9.3f} {spread:>17s} {r['err']:17.3g} {r['rel']:9.2e}")
    if cuda and "oasr" in rows and "inductor" in rows:
        print(f"oasr vs inductor ({mode or 'default'} mode, median of {iters}): "
              f"{rows['inductor']['median'] / rows['oasr']['median']:.3f}x")
    print()
    if "oasr" in rows:
        oasr_ops.tuning_report()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

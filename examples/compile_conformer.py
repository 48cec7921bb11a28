"""Compile the example Conformer with ``torch.compile(backend="oasr")``, run it, print what served.

    python examples/compile_conformer.py                      # CPU: the ops run their reference path
    python examples/compile_conformer.py --device cuda        # GPU: CUDA graphs + CUTLASS kernels from the DB
    python examples/compile_conformer.py --size M --batch 8 --frames 1000 --dynamic

On a GPU the default mode is ``reduce-overhead`` (CUDA graphs); ``--prewarm`` first measures the model's GEMM
points no tuning DB tier covers into the user tier (``TuningConfig(mode="prewarm")``).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `examples` importable from a checkout

import oasr_ops  # noqa: E402
from examples.conformer import build_model, example_inputs  # noqa: E402
from oasr_ops.families.gemm import ops as library  # noqa: E402
from oasr_ops.inductor.rewrite import rewrite_log  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="S")
    p.add_argument("--layers", type=int, default=None, help="override num_layers (fewer = faster compile)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--frames", type=int, default=400)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--mode", default=None, help="torch.compile mode (default: reduce-overhead on a GPU)")
    p.add_argument("--dynamic", action="store_true", help="compile once for every batch x time size")
    p.add_argument("--prewarm", action="store_true", help="TuningConfig(mode='prewarm') before compiling")
    p.add_argument("--strict", action="store_true", help="TuningConfig(strict=True): refuse uncovered points")
    p.add_argument("--attention", default="sdpa", help="sdpa | rel_pos (explicit matmuls: oasr.bmm sites)")
    args = p.parse_args(argv)

    kw = {"attention": args.attention, **({} if args.layers is None else {"num_layers": args.layers})}
    model = build_model(args.size, dtype=args.dtype, device=args.device, **kw)
    (x,) = example_inputs(args.batch, args.frames, dtype=args.dtype, device=args.device)
    mode = args.mode or ("reduce-overhead" if args.device.startswith("cuda") else None)
    tuning = oasr_ops.TuningConfig(mode="prewarm" if args.prewarm else "off", strict=args.strict)
    try:  # registered by the package's entry point after `pip install`
        torch._dynamo.lookup_backend("oasr")
        backend = "oasr"
    except Exception:  # a bare checkout on PYTHONPATH: pass the backend itself
        from oasr_ops.inductor.backend import oasr_backend as backend
    # torch.compile takes `mode` or `options`, not both: the oasr backend reads the mode from its options.
    compiled = torch.compile(model, backend=backend, dynamic=args.dynamic or None,
                             options={"tuning": tuning, "mode": mode})
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = compiled(x)
        t1 = time.perf_counter()
        for _ in range(3):
            out = compiled(x)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        ref = model(x)
    err = (out.float() - ref.float()).abs().max().item()
    print(f"conformer {args.size} on {args.device}: input {tuple(x.shape)} -> {tuple(out.shape)}; "
          f"compile+first call {t1 - t0:.1f}s, then {(t2 - t1) / 3 * 1e3:.2f} ms/call; max |compiled - eager| "
          f"= {err:.3g}")
    print()
    oasr_ops.tuning_report()
    print()
    log = rewrite_log()
    if log:
        print("baked into the compiled graph (last graph):")
        seen = set()
        for s in log[-1].sites:
            key = (s.signature, s.m, s.config)
            if key in seen:
                continue
            seen.add(key)
            n = sum(1 for t in log[-1].sites if (t.signature, t.m, t.config) == key)
            m = s.m if s.m is not None else "symbolic"
            where = " (kept as the aten node: cuBLAS)" if s.config in ("torch", "regions:*=torch") else ""
            print(f"  {n:3d} x {s.signature} M={m}: {s.config} [{s.tier}]{where}")
    plans = [*library.served(), *sys.modules["oasr_ops.families.scaled_mm.ops"].served(), *sys.modules["oasr_ops.families.bmm.ops"].served()]
    if plans:
        print("kernels that served (CUDA plans):")
        for pl in plans:
            print(f"  {pl.signature}: {pl.config} [{pl.tier}] x{pl.calls}")
    else:
        print("kernels that served: the CPU reference path (the oasr ops' CPU implementations)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What Dynamo's float guards cost per call without the profiler: the serving Conformer compiled with
``dynamic=True``, ``torch._dynamo.config.specialize_float`` False (torch 2.11's default: 112 `aten::item` guard reads
per forward, docs/perf/e2e.md session 24) vs True (none), timed without any profiler.

Why: session 24 found the guards with the profiler, whose ~100 us per forward is an upper estimate; the guide tells
users of ``dynamic=True`` to set ``specialize_float = True`` and needs the real number. Each variant is its own
deep copy of the model compiled with its setting (the setting is read while Dynamo traces: set around the first
calls); rounds alternate the variants; one utterance of 394 frames (the host-bound case), after a second length so
the compiled graph is the dynamic one serving traffic sees.

    python benchmarks/specialize_float_host.py --backends inductor,oasr --out sf.json
"""
from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def per_call_ms(fn, args, calls: int, sync_each: bool) -> float:
    """Mean wall ms per call over `calls` calls: back to back (one sync at the end) or synchronous."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
        if sync_each:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="M")
    ap.add_argument("--frames", type=int, default=394)
    ap.add_argument("--also-frames", type=int, default=1201)
    ap.add_argument("--backends", default="inductor,oasr")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch._dynamo.config as dynamo_config

    from examples.conformer import build_model, example_inputs

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    model = build_model(size=args.size).to("cuda", torch.float16).eval()
    feats, lengths = example_inputs(batch=1, frames=args.frames, device="cuda", with_lengths=True)
    other, other_len = example_inputs(batch=1, frames=args.also_frames, device="cuda", with_lengths=True)
    x, x2 = (feats.half(), lengths), (other.half(), other_len)
    variants: dict[str, object] = {}
    res: dict = {**vars(args), "torch": torch.__version__, "device": torch.cuda.get_device_name(), "compile_s": {},
                 "rounds": {}}
    with torch.no_grad():
        for backend in args.backends.split(","):
            for sf in (False, True):
                name = f"{backend}-sf{int(sf)}"
                from oasr_ops.inductor.backend import oasr_backend  # a checkout has no "oasr" entry point

                # Dynamo caches per code object, and a deep copy's forward is the same code: a first run reused the
                # first variant's graph for the second (its guards passed). A wrapper of its own per variant.
                ns: dict = {}
                exec(f"def serve_{backend}_{int(sf)}(m, feats, lengths):\n    return m(feats, lengths)\n", ns)
                compiled = torch.compile(ns[f"serve_{backend}_{int(sf)}"],
                                         backend=oasr_backend if backend == "oasr" else backend, dynamic=True)
                fn = functools.partial(compiled, copy.deepcopy(model))
                t0 = time.perf_counter()
                with dynamo_config.patch(specialize_float=sf):
                    for a in (x, x2, x, x2, x):
                        fn(*a)
                torch.cuda.synchronize()
                res["compile_s"][name] = time.perf_counter() - t0
                variants[name] = fn
                print(f"{name}: compiled and warm in {res['compile_s'][name]:.1f} s", flush=True)
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            line = []
            for name in order:
                fn = variants[name]
                fn(*x)  # untimed replay
                b2b = per_call_ms(fn, x, args.calls, sync_each=False)
                sync = per_call_ms(fn, x, args.calls, sync_each=True)
                res["rounds"].setdefault(name, []).append({"back_to_back_ms": b2b, "synchronous_ms": sync})
                line.append(f"{name} {b2b:.3f}/{sync:.3f}")
            print(f"round {r}: " + "  ".join(line) + "  (ms per call, back to back / synchronous)", flush=True)
    res["median"] = {n: {k: statistics.median(x[k] for x in rows) for k in ("back_to_back_ms", "synchronous_ms")}
                     for n, rows in res["rounds"].items()}
    for backend in args.backends.split(","):
        off, on = res["median"][f"{backend}-sf0"], res["median"][f"{backend}-sf1"]
        res.setdefault("saved_us", {})[backend] = {k: (off[k] - on[k]) * 1e3 for k in off}
        print(f"{backend}: specialize_float=True saves {res['saved_us'][backend]} us per call (median of rounds)")
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

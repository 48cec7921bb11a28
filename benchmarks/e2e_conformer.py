"""End-to-end Conformer latency: eager vs torch.compile(backend="inductor") vs backend="oasr", CUDA graphs.

  python benchmarks/e2e_conformer.py --size M --batch 16 --frames 1000 --out e2e.json

Latency: median of --iters calls (CUDA events around each call, after warm-up), mode="reduce-overhead".
Numerics: max |out - ref| / max |ref| against the same weights run eagerly in fp32. Compile time: wall time of
the first call (dynamo + AOT + Inductor + graph capture), with this process's kernel JIT cache already warm.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")


def latency_ms(fn, x, iters: int) -> float:
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(x)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="M")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--frames", type=int, default=1000)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--backends", default="eager,inductor,oasr")
    p.add_argument("--quantization", default=None,
                   help="int8_w8a8: backends named NAME+int8 (e.g. oasr+int8) run the model after quantize_()")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    import oasr_ops
    from examples.conformer import build_model, example_inputs
    from oasr_ops.library import served

    model = build_model(size=a.size, dtype=torch.float16, device="cuda", seed=0)
    x = example_inputs(batch=a.batch, frames=a.frames, dtype=torch.float16, device="cuda", seed=1)[0]
    ref_model = build_model(size=a.size, dtype=torch.float32, device="cuda", seed=0)
    with torch.no_grad():
        ref = ref_model(x.float()).float()
    del ref_model
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "size": a.size, "batch": a.batch, "frames": a.frames, "mode": "reduce-overhead", "runs": {}}
    qmodel = None
    if a.quantization:
        import copy

        qmodel = oasr_ops.quantize_(copy.deepcopy(model), a.quantization)  # weights quantized once
    for backend in a.backends.split(","):
        torch.compiler.reset()
        oasr_ops.reload_tuning()
        quant = backend.endswith("+int8")
        backend = backend.removesuffix("+int8")
        m = qmodel if quant else model
        if backend == "eager":
            fn = m
            t0 = time.perf_counter()
        else:
            # The entry point registers "oasr" for an installed package; from a bare checkout pass the callable.
            from oasr_ops.inductor.backend import oasr_backend

            fn = torch.compile(m, backend=oasr_backend if backend == "oasr" else backend, mode="reduce-overhead")
            t0 = time.perf_counter()
        with torch.no_grad():
            out = fn(x)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            for _ in range(3):
                fn(x)
            torch.cuda.synchronize()
            lat = latency_ms(fn, x, a.iters)
            out = fn(x).float()
        err = ((out - ref).abs().max() / ref.abs().max()).item()
        backend = backend + ("+int8" if quant else "")
        res["runs"][backend] = {"latency_ms": lat, "first_call_s": first, "rel_err_vs_fp32": err}
        print(backend, res["runs"][backend], flush=True)
    res["served"] = sorted({(p.signature, p.config, p.tier) for p in served()})
    res["tuning_report"] = oasr_ops.tuning_report(print_=False) if hasattr(oasr_ops, "tuning_report") else None
    if "inductor" in res["runs"] and "oasr" in res["runs"]:
        res["oasr_speedup_vs_inductor"] = res["runs"]["inductor"]["latency_ms"] / res["runs"]["oasr"]["latency_ms"]
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(json.dumps({k: v for k, v in res.items() if k not in ("served", "tuning_report")}, indent=1,
                     default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

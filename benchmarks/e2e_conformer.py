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


def profile(model, backend: str, x, iters: int, grad: bool, options: dict | None = None) -> list[dict]:
    """Top kernels by GPU time over `iters` calls, compiled without CUDA graphs (so the profiler sees kernels)
    and with the run's compile `options`."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    torch.compiler.reset()
    name = backend.removesuffix("+int8")
    if name == "eager":
        fn = model
    else:
        from oasr_ops.inductor.backend import oasr_backend

        fn = torch.compile(model, backend=oasr_backend if name == "oasr" else name, options=options or None)
    with torch.set_grad_enabled(grad):
        for _ in range(3):
            fn(x)
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn(x)
            torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t > 0:
            rows.append({"kernel": ev.key[:120], "calls_per_iter": ev.count / iters, "us_per_iter": t / iters})
    rows.sort(key=lambda r: -r["us_per_iter"])
    total = sum(r["us_per_iter"] for r in rows)
    print(f"  profile {backend}: {total:.0f} us of kernels per call (no CUDA graphs)")
    for r in rows[:20]:
        print(f"    {r['us_per_iter']:8.1f} us  {r['calls_per_iter']:6.1f}x  {r['kernel']}")
    return rows[:60]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="M")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--frames", type=int, default=1000)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--backends", default="eager,inductor,oasr")
    p.add_argument("--quantization", default=None,
                   help="int8_w8a8: backends named NAME+int8 (e.g. oasr+int8) run the model after quantize_()")
    p.add_argument("--quantize-only", default=None,
                   help="comma list of layer names (the last part of the module path, e.g. fc1,qkv,pointwise1): "
                        "quantize_ only those")
    p.add_argument("--attention", default="sdpa", help="the model's attention: sdpa | rel_pos (explicit matmuls)")
    p.add_argument("--conv-impl", default="linear",
                   help="the conv module's pointwise convs: linear (nn.Linear) | conv1d (nn.Conv1d, ESPnet/NeMo form)")
    p.add_argument("--grad", action="store_true",
                   help="run with autograd enabled (parameters require grad) instead of under torch.no_grad()")
    p.add_argument("--profile", type=int, default=0,
                   help="after timing, profile N calls of each backend without CUDA graphs and print the top "
                        "kernels by GPU time")
    p.add_argument("--options", default=None,
                   help='JSON of torch.compile options for the compiled backends, e.g. \'{"triton.multi_kernel": 1}\'')
    p.add_argument("--out", required=True)
    a = p.parse_args()
    options = json.loads(a.options) if a.options else None

    import oasr_ops
    from examples.conformer import build_model, example_inputs
    from oasr_ops.families.gemm.ops import served

    model = build_model(size=a.size, dtype=torch.float16, device="cuda", seed=0, attention=a.attention,
                        conv_impl=a.conv_impl)
    x = example_inputs(batch=a.batch, frames=a.frames, dtype=torch.float16, device="cuda", seed=1)[0]
    ref_model = build_model(size=a.size, dtype=torch.float32, device="cuda", seed=0, attention=a.attention,
                            conv_impl=a.conv_impl)
    with torch.no_grad():
        ref = ref_model(x.float()).float()
    del ref_model
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "size": a.size, "batch": a.batch, "frames": a.frames, "mode": "reduce-overhead",
           "attention": a.attention, "conv_impl": a.conv_impl, "grad": a.grad, "options": options, "quantize_only": a.quantize_only,
           "runs": {}}
    qmodel = None
    if a.quantization:
        import copy

        only = set(a.quantize_only.split(",")) if a.quantize_only else None
        qmodel = oasr_ops.quantize_(copy.deepcopy(model), a.quantization,  # weights quantized once
                                    filter_fn=None if only is None else (lambda m, fqn: fqn.split(".")[-1] in only))
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

            # torch.compile takes `mode` or `options`, not both: with options, Inductor's reduce-overhead is its
            # `triton.cudagraphs` option and the oasr backend reads `mode` from its options.
            if options:
                extra = {"mode": "reduce-overhead"} if backend == "oasr" else {"triton.cudagraphs": True}
                fn = torch.compile(m, backend=oasr_backend if backend == "oasr" else backend,
                                   options={**options, **extra})
            else:
                fn = torch.compile(m, backend=oasr_backend if backend == "oasr" else backend,
                                   mode="reduce-overhead")
            t0 = time.perf_counter()
        with torch.set_grad_enabled(a.grad):
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
        if a.profile:
            res["runs"][backend]["profile"] = profile(m, backend, x, a.profile, a.grad, options)
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

"""backend="oasr" vs backend="inductor", same mode, alternating rounds in one process, on any encoder.

  python benchmarks/e2e_compare.py --model examples.whisper:build_model --model-args size=small \
      --inputs examples.whisper:example_inputs --input-args batch=8 --rounds 5 --out e2e_whisper_small.json

Both backends compile their own copy of the same fp16 weights (mode="reduce-overhead": CUDA graphs). Then R
rounds alternate inductor / oasr (the order flips every round); each round times --iters calls with CUDA events
after warm-up and keeps the median. Reported per backend: the median over rounds and the spread (max - min over
rounds, % of the median); the ratio inductor/oasr of the medians (> 1: oasr faster). Error: max |out - ref| /
max |ref| against the same weights run eagerly in fp32. Tuning: whatever the DB/tiers say (OASR_TUNE_USER_DB=off
for "untuned"); --tuning prewarm[:budget_s] measures uncovered points before compiling. --autocast fp16|bf16: the
model stays fp32 and every call (compile included) runs under torch.autocast("cuda", dtype). --mha-fastpath
off-for-oasr: Inductor compiles and runs with PyTorch's fused transformer fast path (the default), oasr with
`torch.backends.mha.set_fastpath_enabled(False)` (so its pass sees the Linears); `off`: both without it.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import json
import statistics
import time

import torch


def _load(spec: str):
    mod, _, fn = spec.partition(":")
    return getattr(importlib.import_module(mod), fn)


def _kwargs(s: str | None) -> dict:
    out = {}
    for part in (s or "").split(","):
        if part.strip():
            k, _, v = part.partition("=")
            try:
                out[k.strip()] = int(v)
            except ValueError:
                out[k.strip()] = v.strip()
    return out


def latency_ms(fn, x, iters: int) -> float:
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(*x)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """--model / --model-args / --inputs / --input-args: the encoder a benchmark builds (`_load`, `_kwargs`)."""
    p.add_argument("--model", required=True, help="module:function building the model (kwargs dtype, device)")
    p.add_argument("--model-args", default="", help="k=v,... passed to the builder")
    p.add_argument("--inputs", required=True, help="module:function returning the example input tuple")
    p.add_argument("--input-args", default="", help="k=v,... passed to the inputs function")


def with_fastpath(fn, enabled: bool):
    """`fn` called with PyTorch's MHA / TransformerEncoderLayer fast path on or off (Dynamo reads the setting while
    tracing, and guards on it): off, a stock encoder's Linears reach the backend's passes."""
    def call(*args):
        was = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(enabled)
        try:
            return fn(*args)
        finally:
            torch.backends.mha.set_fastpath_enabled(was)
    return call


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(p)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--mode", default="reduce-overhead")
    p.add_argument("--tuning", default="off", help="off | prewarm[:budget_s]")
    p.add_argument("--autocast", choices=("fp16", "bf16"), default=None,
                   help="an fp32 model run under torch.autocast with this dtype (default: an fp16 model)")
    p.add_argument("--mha-fastpath", choices=("on", "off", "off-for-oasr"), default="on",
                   help="PyTorch's fused nn.TransformerEncoderLayer / MultiheadAttention path per backend")
    p.add_argument("--oasr-options", default=None, help='JSON merged into the oasr backend\'s options, e.g. '
                   '\'{"quantization": "int8_w8a8", "fuse_quantization": true}\'')
    p.add_argument("--out", required=True)
    a = p.parse_args()

    import oasr_ops
    from oasr_ops.inductor.backend import oasr_backend

    build, inputs = _load(a.model), _load(a.inputs)
    margs, iargs = _kwargs(a.model_args), _kwargs(a.input_args)
    dtype = torch.float32 if a.autocast else torch.float16
    model = build(**margs, dtype=dtype, device="cuda", seed=0).eval()
    x = tuple(inputs(**iargs, dtype=dtype, device="cuda", seed=1))
    ref_model = build(**margs, dtype=torch.float32, device="cuda", seed=0).eval()
    with torch.no_grad():
        ref = ref_model(*(t.float() for t in x)).float()
    del ref_model

    oasr_opts: dict = {"mode": a.mode, **(json.loads(a.oasr_options) if a.oasr_options else {})}
    if a.tuning.startswith("prewarm"):
        budget = float(a.tuning.partition(":")[2] or 120)
        oasr_opts["tuning"] = oasr_ops.TuningConfig(mode="prewarm", budget_s=budget)
    fns = {"inductor": torch.compile(copy.deepcopy(model), backend="inductor", mode=a.mode),
           "oasr": torch.compile(copy.deepcopy(model), backend=oasr_backend, options=oasr_opts)}
    # each backend compiles and runs with its own fast-path setting (Dynamo reads it while tracing)
    fast = {"inductor": a.mha_fastpath == "on" or a.mha_fastpath == "off-for-oasr", "oasr": a.mha_fastpath == "on"}
    fns = {name: with_fastpath(fn, fast[name]) for name, fn in fns.items()}
    if a.autocast:
        ac_dtype = torch.float16 if a.autocast == "fp16" else torch.bfloat16

        def under_autocast(fn):
            def call(*args):
                with torch.autocast("cuda", dtype=ac_dtype):
                    return fn(*args)
            return call
        fns = {name: under_autocast(fn) for name, fn in fns.items()}
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "model": a.model, "model_args": margs, "inputs": iargs, "mode": a.mode, "tuning": a.tuning,
           "autocast": a.autocast, "mha_fastpath": a.mha_fastpath, "oasr_options": a.oasr_options,
           "rounds": a.rounds, "iters": a.iters, "first_call_s": {}, "rel_err_vs_fp32": {}, "round_ms": {}}
    with torch.no_grad():
        for name, fn in fns.items():
            t0 = time.perf_counter()
            out = fn(*x)
            torch.cuda.synchronize()
            res["first_call_s"][name] = time.perf_counter() - t0
            for _ in range(5):
                out = fn(*x)
            torch.cuda.synchronize()
            res["rel_err_vs_fp32"][name] = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            res["round_ms"][name] = []
        order = list(fns)
        for r in range(a.rounds):
            for name in (order if r % 2 == 0 else order[::-1]):
                res["round_ms"][name].append(latency_ms(fns[name], x, a.iters))
            print(f"round {r}: " + "  ".join(f"{n} {res['round_ms'][n][-1]:.3f} ms" for n in order), flush=True)
    summary = {}
    for name, ts in res["round_ms"].items():
        med = statistics.median(ts)
        summary[name] = {"median_ms": med, "spread_pct": 100.0 * (max(ts) - min(ts)) / med}
    summary["inductor_over_oasr"] = summary["inductor"]["median_ms"] / summary["oasr"]["median_ms"]
    res["summary"] = summary
    res["tuning_report"] = oasr_ops.tuning_report(print_=False)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(json.dumps(summary, indent=1))
    print(res["tuning_report"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

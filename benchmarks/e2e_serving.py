"""Serving traffic: variable-length batches, `dynamic=True`, backend="oasr" (fp16, int8) vs backend="inductor".

  python benchmarks/e2e_serving.py --model-args size=M --batches 1,4,16 --requests 24 --mode default \
      --rounds 3 --out e2e_serving.json

Every other e2e benchmark here times one fixed shape (B=16 x 10 s). A service sees utterances of every length in
batches of every size, padded to the batch's longest and masked (`lengths`). This one builds a seeded request list
(`--requests` batches; batch sizes cycled from --batches, utterance lengths uniform in [--min-s, --max-s] seconds at
100 frames/s, the batch padded to its longest, optionally rounded up to --bucket-frames) and serves it with each
variant, each compiled ONCE with `dynamic=True` (a new length must not recompile). A Whisper-style encoder
(`--model examples.whisper:build_model`, a fixed 30 s window: `Interface`) gets the same traffic padded to its
window, so only the batch size varies, and its error counts every output position:

  fp16        the fp16 model, backend="inductor" (the baseline)
  fp16-oasr   the same weights, backend="oasr"
  int8        `fusable_filter` -> `quantize_(int8_w8a8)` -> `calibrate` (on --calib batches of the same traffic)
              -> backend="oasr" with fuse_quantization="act", fuse_residual=True (the e2e int8 recipe, docs/guide.md)
  int8-ln     the same quantized weights with fuse_quantization=True: the LayerNorms feeding a quantized GEMM become
              `oasr::layer_norm_quant` calls (with "act" Inductor fuses their quantization into its own kernel)
  fp8, fp8-ln the int8 and int8-ln recipes with `quantize_(fp8_w8a8)` (e4m3: the fp8 GEMMs, the fused fc1 and the
              residual GEMM; on the C++ hot path since session 38)
  <base>-graph-regions  (fp16-oasr-graph-regions, int8-graph-regions) the base variant compiled with
              options={"eager_regions": False}: the tuning DB's graph regions also without CUDA graphs (by default
              the backend bakes the entries' regions_eager there: tune/serving_regions.py) — the A/B of that rule
  fp16-oasr-floor<F>  fp16-oasr compiled while a user tier holds the shipped gemm entries with their
              regions_eager re-derived at a launch-bound floor of F us (`oasr tune serving-regions --seed-from system
              --floor-us F`; the shipped floor is 19 us, 8 before session 17): the A/B of that floor within one
              process (the other variants compile under the tiers the environment names)
  <base>-frz  (fp16-frz, fp16-oasr-frz, int8-frz, int8-ln-frz) the base variant compiled with Inductor's freezing
              (torch._inductor.config.freezing set while it compiles and warms up; the option {"freezing": True}
              as well, only to keep its compiled code its own): parameters become constants, so per-call transforms
              of weights (the BatchNorm folds, the act-quant GEMMs' fp32 bias casts, sibling weight concatenations)
              are folded at compile time instead of launching kernels on every call; the parameters must not change
              afterwards. fp16-frz is the baseline for a frozen variant: Inductor with freezing too
  <base>-cpp  (fp16-oasr-cpp, int8-cpp, fp8-cpp, fp16-oasr-floor<F>-cpp) the base variant's compiled function with
              the C++ hot path (gemm, the int8 and fp8 GEMMs, the depthwise conv, layer_norm_quant) on
              (`oasr_ops.enable_cpp_hot_path()`, docs/architecture.md), switched on around each of its passes; a base
              named only through its -cpp variant is compiled but not timed.
  <base>-cpp-nolnq  the same with every op but layer_norm_quant in C++ (its A/B: served in C++ since session 18).
              The base variants compile with options={"cpp_hot_path": False}: without CUDA graphs the backend
              would otherwise switch the hot path on for the whole process, and the A/B would compare it with itself
              (`-cpp` is what backend="oasr" serves by default without CUDA graphs)

--mode default: no CUDA graphs (host time per op counts, as in a service that does not capture graphs);
--mode reduce-overhead: CUDA graphs, one recording per distinct shape (the warm-up serves the traffic twice: a
new shape is warmed up on its first call and recorded on its second; the timed rounds replay). Per variant: first-call (compile) seconds, the warm-up pass's seconds (recompiles and recordings),
Dynamo's graph count, then --rounds timed passes over the whole traffic, variants alternating (order reversed every
round), each request timed synchronously with CUDA events (its latency as a caller sees it). Reported: total ms
per pass (median over rounds), per batch size, ratios vs fp16 inductor; accuracy per request on the valid frames
only: max |out - ref| / max |ref| against the same weights in fp32 eager (the worst request is reported).
Diagnostics (each after the rounds, outside them): --launch-profile N (the smallest and the largest request
repeated: wall ms back to back and synchronous, profiler device time, launches per call, the ops with the most CPU
time: host-bound or GPU-bound?), --cycle-profile N (the requests in turn vs each repeated: do shape changes cost?
device allocations per request), --host-profile N (cProfile), --always-warnings-round (one more round recording
every warning, as the method before session 13 did).
--device cpu: the same logic once on a tiny model, untimed (a smoke test of dynamic shapes through the passes).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import dataclasses
import functools
import json
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")

FRAMES_PER_S = 100
FROZEN = "-frz"  # a variant compiled with Inductor's freezing (module docstring)


def traffic(n: int, batches: list[int], min_s: float, max_s: float, bucket: int, seed: int
            ) -> list[tuple[int, int, list[int]]]:
    """`n` requests (batch, padded frames, per-utterance lengths longest first), seeded."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        b = batches[i % len(batches)]
        lens = sorted((rng.randint(int(min_s * FRAMES_PER_S), int(max_s * FRAMES_PER_S)) for _ in range(b)),
                      reverse=True)
        t = lens[0] if bucket <= 1 else -(-lens[0] // bucket) * bucket
        out.append((b, t, lens))
    return out


@dataclasses.dataclass(frozen=True)
class Interface:
    """How the model is called with a request and which of its output frames count.

    window 0: the Conformer's `(features (B, T, n_mels), lengths) -> (out, out_lengths)`, T the batch's padded length.
    window W > 0: a Whisper-style encoder, `(mel (B, n_mels, W),) -> out (B, P, d)`: every request is padded to the
    fixed window (only the batch size varies), and every output position counts (a decoder cross-attends to all)."""

    n_mels: int
    window: int = 0

    def inputs(self, req, dtype, device, seed: int) -> tuple:
        b, t, lens = req
        g = torch.Generator().manual_seed(seed)
        feats = torch.randn(b, self.window or t, self.n_mels, generator=g)
        for i, n in enumerate(lens):  # padded frames are zeros, as a feature pipeline pads
            feats[i, n:] = 0
        if self.window:
            return (feats.transpose(1, 2).contiguous().to(device=device, dtype=dtype),)
        return feats.to(device=device, dtype=dtype), torch.tensor(lens, dtype=torch.int64, device=device)

    def outputs(self, out) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, valid frames per batch row)."""
        if self.window:
            return out, torch.full((out.shape[0],), out.shape[1], device=out.device)
        return out

    def rel_err(self, out, ref: torch.Tensor) -> float:
        """max |out - ref| / max |ref| over the valid frames."""
        out, out_lens = self.outputs(out)
        valid = torch.arange(out.shape[1], device=out.device)[None, :] < out_lens[:, None]
        d = (out.float() - ref.float()).abs()[valid]
        return float(d.max() / ref.float().abs()[valid].max())


@contextlib.contextmanager
def user_tier(path):
    """Compile under a user tier at `path` (None: the environment's tiers): the DB is re-read on entry and on exit
    (a new epoch; compiled graphs are kept, the graphs baked their tables)."""
    import os

    from oasr_ops.runtime.reload import reload_tuning

    if path is None:
        yield
        return
    saved = os.environ.get("OASR_TUNE_USER_DB")
    os.environ["OASR_TUNE_USER_DB"] = str(path)
    reload_tuning(reset_compiled=False)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("OASR_TUNE_USER_DB", None)
        else:
            os.environ["OASR_TUNE_USER_DB"] = saved
        reload_tuning(reset_compiled=False)


def floor_tier(floor_us: float, root) -> Path:
    """A user tier holding the shipped sm90 gemm entries with their regions_eager re-derived at `floor_us` (what
    `oasr tune serving-regions --tier DIR --seed-from system --floor-us F` writes)."""
    from oasr_ops.tune.serving_regions_cli import derive_file

    d = Path(root) / f"floor{floor_us:g}"
    changed = derive_file("gemm", "sm90", str(d), floor_us * 1e-6, seed_from="system")
    print(f"floor {floor_us:g} us: {len(changed)} gemm entries re-derived in {d}", flush=True)
    return d


def serve_all(variants: dict, iface: Interface, inputs: list, refs: list, mode: str, cuda: bool, res: dict,
              tiers: dict | None = None) -> dict:
    """Compile each variant once (dynamic=True) and warm it on the whole traffic (errors vs fp32); fills `res`,
    returns {name: compiled fn}. `tiers`: {name: user tier directory} for variants compiled under their own."""
    from torch._dynamo.utils import counters

    fns = {}
    # One Dynamo state for all variants (a reset would drop the earlier variants' code: they would recompile in the
    # timed rounds); backends are part of the guards, so the variants never share a graph. Each variant holds two
    # entries of the encoder's forward (batch 1 is specialised), so the cache limit is raised above the default 8.
    torch.compiler.reset()
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    graphs = lambda: int(counters["stats"]["unique_graphs"])  # noqa: E731
    with torch.no_grad():
        for name, (m, backend, opts) in variants.items():
            before = graphs()
            if backend != "inductor":
                kw = {"options": {**opts, "mode": mode}}
            else:  # torch.compile takes mode or options, not both: the mode's own options, then the variant's
                kw = {"options": {**torch._inductor.list_mode_options(mode), **opts}} if opts else {"mode": mode}
            fn = torch.compile(m, backend=backend, dynamic=True, **kw)
            # Freezing is read from the global config when Dynamo traces (an option alone freezes nothing: the
            # backend warns); the option stays in `kw` so that this variant's compiled code is its own
            frozen = torch._inductor.config.patch(freezing=True) if opts and opts.get("freezing") else \
                contextlib.nullcontext()
            with user_tier((tiers or {}).get(name)), frozen:
                t0 = time.perf_counter()
                fn(*inputs[0])
                if cuda:
                    torch.cuda.synchronize()
                res["first_call_s"][name] = time.perf_counter() - t0
                t0 = time.perf_counter()
                # reduce-overhead: CUDA-graph trees warm a new shape up on its first call and record it on the
                # second, so the warm-up serves the traffic twice (the timed rounds then only replay); errors from
                # the last pass
                for _ in range(2 if mode == "reduce-overhead" else 1):
                    errs = []
                    for args, ref in zip(inputs, refs):
                        errs.append(iface.rel_err(fn(*args), ref))
                if cuda:
                    torch.cuda.synchronize()
                res["warm_pass_s"][name] = time.perf_counter() - t0
            res["graphs"][name] = graphs() - before
            if name in (tiers or {}) and res["graphs"][name] == 0:
                raise SystemExit(f"{name} compiled no graph of its own: it would time another variant's code")
            res["worst_rel_err"][name] = max(errs)
            res.setdefault("rel_err", {})[name] = errs
            print(f"{name}: first call {res['first_call_s'][name]:.1f} s, warm pass {res['warm_pass_s'][name]:.1f} s, "
                  f"{res['graphs'][name]} graph(s), worst rel. err {max(errs):.3g}", flush=True)
            fns[name] = fn
    return fns


class HotPathVariant:
    """A compiled variant served with the C++ hot path on (oasr_ops/families/hot_path.py, every op it serves): the same
    compiled function as its base variant, the hot path switched on around each pass (`serving()`), outside the
    timed requests; its installed plans stay while it is off."""

    def __init__(self, fn, ops: tuple[str, ...] | None = None) -> None:
        self.fn = fn
        self.ops = ops

    def __call__(self, *args):
        return self.fn(*args)

    @contextlib.contextmanager
    def serving(self):
        import oasr_ops

        oasr_ops.enable_cpp_hot_path("CUDA", self.ops)
        try:
            yield
        finally:
            oasr_ops.disable_cpp_hot_path()


def serving(fn):
    """The context a variant's calls run in (the hot path on for a HotPathVariant, nothing otherwise)."""
    return fn.serving() if isinstance(fn, HotPathVariant) else contextlib.nullcontext()


def layer_norm_quant_calls() -> int:
    """`oasr::layer_norm_quant` kernel calls so far (Python's and, collected, the C++ hot path's)."""
    from oasr_ops.families import hot_path
    from oasr_ops.families.layer_norm_quant import ops as lnq

    hot_path.collect_calls()
    return sum(p.calls for p in lnq._LAUNCHES.values() if p is not None)


def hot_path_base(name: str) -> str | None:
    """The base variant of a hot-path variant (`<base>-cpp`, `<base>-cpp-nolnq`), else None."""
    for suffix in ("-cpp", "-cpp-nolnq"):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return None


def add_hot_path_variants(fns: dict, names: list, iface: Interface, inputs: list, refs: list, res: dict) -> None:
    """`<base>-cpp` (`-cpp-nolnq`) for each requested base variant compiled: its function under the hot path, warmed
    on the traffic (each call key's first call installs its plan) with its errors vs fp32 recorded."""
    from oasr_ops.families.hot_path import OPS

    for name in names:
        base = hot_path_base(name)
        if base is None or base not in fns:
            continue
        ops = tuple(op for op in OPS if op != "layer_norm_quant") if name.endswith("-nolnq") else None
        fn = HotPathVariant(fns[base], ops)
        lnq_before = layer_norm_quant_calls()
        t0 = time.perf_counter()
        with torch.no_grad(), serving(fn):
            errs = [iface.rel_err(fn(*args), ref) for args, ref in zip(inputs, refs)]
            torch.cuda.synchronize()
        res["warm_pass_s"][name] = time.perf_counter() - t0
        res.setdefault("layer_norm_quant_calls_per_request", {})[name] = \
            (layer_norm_quant_calls() - lnq_before) / len(inputs)
        res["worst_rel_err"][name] = max(errs)
        res.setdefault("rel_err", {})[name] = errs
        print(f"{name}: warm pass {res['warm_pass_s'][name]:.1f} s, worst rel. err {max(errs):.3g}", flush=True)
        fns[name] = fn


def timed_rounds(fns: dict, inputs: list, rounds: int, res: dict, label: str = "round") -> None:
    """`rounds` timed passes over the traffic, variants alternating (order reversed every other round); each request
    timed synchronously with CUDA events. Fills res["pass_ms"] / res["request_ms"] and the recompile count."""
    from torch._dynamo.utils import counters

    before = int(counters["stats"]["unique_graphs"])
    with torch.no_grad():
        for r in range(rounds):
            for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                ts = []
                with serving(fns[name]):
                    for args in inputs:
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        fns[name](*args)
                        e.record()
                        e.synchronize()
                        ts.append(s.elapsed_time(e))
                res["pass_ms"].setdefault(name, []).append(sum(ts))
                res.setdefault("request_ms", {}).setdefault(name, []).append(ts)
            print(f"{label} {r}: " + "  ".join(f"{n} {res['pass_ms'][n][-1]:.1f} ms" for n in fns), flush=True)
    # 0: no length recompiled after the warm pass
    res["graphs_compiled_in_timed_rounds"] = int(counters["stats"]["unique_graphs"]) - before


_LAUNCH_APIS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx",
                "cudaGraphLaunch")


def launch_profile(fn, args: tuple, shape: tuple[int, int], calls: int, top: int = 25) -> dict:
    """Where a call's time goes without CUDA graphs: per call, the kernel launches (runtime API calls), the GPU
    kernel time (torch.profiler), the wall time of `calls` back-to-back calls without the profiler (one sync at the
    end) and of one synchronous call; the ops with the most CPU time (oasr::* and aten::*, children included).
    wall >> GPU time: the call is host-bound, and host time per op is what decides it."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        for _ in range(3):
            fn(*args)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
        pipelined = (time.perf_counter() - t0) / calls
        syncs = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn(*args)
            torch.cuda.synchronize()
            syncs.append(time.perf_counter() - t0)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(*args)
            torch.cuda.synchronize()
    rows = prof.key_averages()

    def dev_us(e) -> float:
        return float(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) or 0)

    launches = sum(e.count for e in rows if e.key in _LAUNCH_APIS)
    ops = sorted((e for e in rows if e.key.startswith(("oasr::", "aten::"))), key=lambda e: -e.cpu_time_total)
    kernels = sorted((e for e in rows if dev_us(e) > 0), key=lambda e: -dev_us(e))
    return {"batch": shape[0], "frames": shape[1], "calls": calls,
            "wall_ms_pipelined": 1e3 * pipelined, "wall_ms_sync": 1e3 * statistics.median(syncs),
            "gpu_ms": sum(dev_us(e) for e in rows) / 1e3 / calls,
            "launches": launches / calls,
            "top_ops": [{"op": e.key, "per_call": e.count / calls, "cpu_us_per_call": e.cpu_time_total / calls}
                        for e in ops[:top]],
            "top_kernels": [{"kernel": e.key[:120], "per_call": e.count / calls, "gpu_us_per_call": dev_us(e) / calls}
                            for e in kernels[:top]]}


def cycle_profile(fn, inputs: list, cycles: int, top: int = 25) -> dict:
    """What changing shapes costs: each request's synchronous wall ms when the requests are served in turn (as the
    timed rounds do) vs the same request repeated; the CUDA caching allocator's device mallocs / frees and
    retries over the cycles; torch.profiler over the cycles: runtime API calls (cudaMalloc, launches, ...) and the
    ops with the most CPU time."""
    from torch.profiler import ProfilerActivity, profile

    def sync_ms(args) -> float:
        t0 = time.perf_counter()
        fn(*args)
        torch.cuda.synchronize()
        return 1e3 * (time.perf_counter() - t0)

    with torch.no_grad():
        for args in inputs:
            fn(*args)
        torch.cuda.synchronize()
        steady = [statistics.median(sync_ms(args) for _ in range(cycles)) for args in inputs]
        m0 = torch.cuda.memory_stats()
        turns: list[list[float]] = [[] for _ in inputs]
        for _ in range(cycles):
            for i, args in enumerate(inputs):
                turns[i].append(sync_ms(args))
        m1 = torch.cuda.memory_stats()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(2):
                for args in inputs:
                    fn(*args)
                    torch.cuda.synchronize()
    rows = prof.key_averages()
    per = 2 * len(inputs)
    apis = sorted((e for e in rows if e.key.startswith(("cuda", "cu"))), key=lambda e: -e.cpu_time_total)
    ops = sorted((e for e in rows if e.key.startswith(("oasr::", "aten::"))), key=lambda e: -e.cpu_time_total)
    delta = {k: m1.get(k, 0) - m0.get(k, 0) for k in ("num_device_alloc", "num_device_free", "num_alloc_retries",
                                                     "allocation.all.allocated", "segment.all.allocated")}
    return {"shapes": [list(args[0].shape) for args in inputs], "steady_ms": steady,
            "in_turn_ms": [statistics.median(t) for t in turns], "cycles": cycles,
            "allocator_delta_per_request": {k: v / (cycles * len(inputs)) for k, v in delta.items()},
            "reserved_gb": torch.cuda.memory_reserved() / 2**30,
            "runtime_apis": [{"api": e.key, "per_request": e.count / per, "cpu_us_per_request": e.cpu_time_total / per}
                             for e in apis[:top]],
            "top_ops": [{"op": e.key, "per_request": e.count / per, "cpu_us_per_request": e.cpu_time_total / per}
                        for e in ops[:top]]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="examples.conformer:build_model")
    p.add_argument("--model-args", default="size=M")
    p.add_argument("--n-mels", type=int, default=80)
    p.add_argument("--window", type=int, default=-1,
                   help="a fixed input window in frames (Interface); default: the model module's "
                        "FIXED_WINDOW_FRAMES if it has one (examples.whisper: 3000), else 0 (features, lengths)")
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--min-s", type=float, default=2.0)
    p.add_argument("--max-s", type=float, default=20.0)
    p.add_argument("--bucket-frames", type=int, default=0, help="round each batch's padded length up to this")
    p.add_argument("--calib", type=int, default=4, help="calibration batches for the int8 variant")
    p.add_argument("--mode", choices=("default", "reduce-overhead"), default="default")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default="fp16,fp16-oasr,fp16-oasr-cpp,int8,int8-cpp",
                   help="comma list (module docstring); a -cpp variant reuses its base variant's compiled function")
    p.add_argument("--host-profile", type=int, default=0,
                   help="cProfile N calls of each variant on the first request after the rounds (host time per op)")
    p.add_argument("--launch-profile", type=int, default=0,
                   help="torch.profiler over N calls of each variant on the smallest and the largest request: "
                        "launches, GPU time and wall time per call, top ops by CPU time")
    p.add_argument("--cycle-profile", type=int, default=0,
                   help="serve the requests in turn N times vs each repeated: the cost of changing shapes")
    p.add_argument("--always-warnings-round", action="store_true",
                   help="one more timed round under warnings.simplefilter('always') (the old method's filter)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    import oasr_ops
    from e2e_compare import _kwargs, _load
    from oasr_ops.inductor.backend import oasr_backend

    dev, cuda = a.device, a.device == "cuda"
    build, margs = _load(a.model), _kwargs(a.model_args)
    batches = [int(b) for b in a.batches.split(",")]
    window = a.window if a.window >= 0 else getattr(sys.modules[build.__module__], "FIXED_WINDOW_FRAMES", 0)
    if window and a.max_s * FRAMES_PER_S > window:
        raise SystemExit(f"--max-s {a.max_s} is longer than the model's window of {window} frames")
    iface = Interface(a.n_mels, window)
    reqs = traffic(a.requests, batches, a.min_s, a.max_s, a.bucket_frames, a.seed)
    inputs = [iface.inputs(r, torch.float16, dev, a.seed + 1000 + i) for i, r in enumerate(reqs)]
    model = build(**margs, dtype=torch.float16, device=dev, seed=0).eval()
    ref_model = build(**margs, dtype=torch.float32, device=dev, seed=0).eval()
    with torch.no_grad():
        refs = [iface.outputs(ref_model(*(t.float() if t.is_floating_point() else t for t in args)))[0].float()
                for args in inputs]
    del ref_model
    print(f"traffic: {len(reqs)} requests, batches {batches}, utterances of "
          f"{min(min(r[2]) for r in reqs)}-{max(r[1] for r in reqs)} frames, "
          f"{len({tuple(args[0].shape) for args in inputs})} distinct input shapes"
          + (f" (the fixed window: {window} frames)" if window else ""), flush=True)

    variants: dict = {}
    names = a.variants.split(",")
    requested = set(names) | {hot_path_base(n) for n in names if hot_path_base(n)}  # a -cpp variant's base compiles
    frozen = {n for n in requested if n.endswith(FROZEN)}
    wanted = requested | {n[:-len(FROZEN)] for n in frozen}  # a frozen variant's base defines it
    if "fp16" in wanted:
        variants["fp16"] = (copy.deepcopy(model), "inductor", {})
    if "fp16-oasr" in wanted:
        variants["fp16-oasr"] = (copy.deepcopy(model), oasr_backend, {"cpp_hot_path": False})
    schemes = [(scheme, prefix) for scheme, prefix in (("int8_w8a8", "int8"), ("fp8_w8a8", "fp8"))
               if prefix in wanted or f"{prefix}-ln" in wanted]
    if schemes:  # one calibration traffic and one layer choice (the fp16 model's) for both schemes
        calib_reqs = traffic(a.calib, batches, a.min_s, a.max_s, a.bucket_frames, a.seed + 1)
        calib = [iface.inputs(r, torch.float16, dev, a.seed + 2000 + i) for i, r in enumerate(calib_reqs)]
        flt = oasr_ops.fusable_filter(copy.deepcopy(model), *calib[0])
    for scheme, prefix in schemes:
        q = oasr_ops.quantize_(copy.deepcopy(model), scheme, filter_fn=flt)
        oasr_ops.calibrate(q, calib)
        if prefix in wanted:
            variants[prefix] = (copy.deepcopy(q), oasr_backend, {"fuse_quantization": "act", "fuse_residual": True,
                                                                 "cpp_hot_path": False})
        if f"{prefix}-ln" in wanted:
            variants[f"{prefix}-ln"] = (copy.deepcopy(q), oasr_backend,
                                        {"fuse_quantization": True, "fuse_residual": True, "cpp_hot_path": False})
    tiers: dict = {}
    for name in sorted(wanted):
        if name.startswith("fp16-oasr-floor") and not name.endswith("-cpp"):
            root = tempfile.mkdtemp(prefix="oasr-floor-")
            tiers[name] = floor_tier(float(name[len("fp16-oasr-floor"):]), root)
            # a backend object of its own: torch.compile wrappers with equal backends and options compare equal,
            # and Dynamo would serve this model fp16-oasr's compiled code (baked under the other tier)
            variants[name] = (copy.deepcopy(model), functools.partial(oasr_backend), {"cpp_hot_path": False})
    for base in ("fp16-oasr", "int8"):
        if f"{base}-graph-regions" in wanted:
            if base not in variants:
                raise SystemExit(f"--variants: {base}-graph-regions needs {base} too")
            m, backend, opts = variants[base]
            variants[f"{base}-graph-regions"] = (copy.deepcopy(m), backend, {**opts, "eager_regions": False})
    for name in sorted(frozen):
        m, backend, opts = variants[name[:-len(FROZEN)]]
        variants[name] = (copy.deepcopy(m), backend, {**opts, "freezing": True})
    for name in [n for n in variants if n not in requested]:
        del variants[name]  # a base only needed to define its frozen variant: neither compiled nor timed
    res: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                 "date": time.strftime("%Y-%m-%d %H:%M"), "model": a.model, "model_args": margs, "mode": a.mode,
                 "requests": [[b, t, lens] for b, t, lens in reqs], "bucket_frames": a.bucket_frames,
                 "first_call_s": {}, "warm_pass_s": {}, "graphs": {}, "worst_rel_err": {}, "pass_ms": {},
                 "per_batch_ms": {}}
    # Compile and warm-up record every warning (a fallback — a kernel not prebuilt, ... — warns once, there); the
    # timed rounds run under the process's own filters, as a service does: under "always", warnings that torch emits
    # on every call would be recorded in the timed path (--always-warnings-round measures what that costs).
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fns = serve_all(variants, iface, inputs, refs, a.mode, cuda, res, tiers)
        if cuda:
            add_hot_path_variants(fns, names, iface, inputs, refs, res)
        for name in [n for n in fns if n not in names]:  # a base compiled only for its -cpp variant: not timed
            del fns[name]
        if cuda and tiers:  # each tier switch started a new DB epoch: plans are re-made once, here, not timed
            with torch.no_grad():
                for fn in fns.values():
                    with serving(fn):
                        for args in inputs:
                            fn(*args)
            torch.cuda.synchronize()
    if cuda:
        timed_rounds(fns, inputs, a.rounds, res)
    if cuda and a.always_warnings_round:
        noisy_res: dict = {"pass_ms": {}}
        with warnings.catch_warnings(record=True) as noisy:
            warnings.simplefilter("always")
            timed_rounds(fns, inputs, 1, noisy_res, label="round with warnings.simplefilter('always')")
        counts = collections.Counter(f"{w.category.__name__}: {str(w.message)[:160]}" for w in noisy)
        res["always_warnings_round"] = {"pass_ms": {k: v[0] for k, v in noisy_res["pass_ms"].items()},
                                        "warnings": len(noisy), "top": counts.most_common(10)}
        print(f"warnings recorded in that round: {len(noisy)}; top: {res['always_warnings_round']['top'][:5]}",
              flush=True)
    if cuda and a.host_profile:
        from e2e_int8_fused import host_profile

        with torch.no_grad():
            res["host_profile"] = {}
            for n, fn in fns.items():
                with serving(fn):
                    res["host_profile"][n] = host_profile(fn, inputs[0], a.host_profile, top=40)
        for n, hp in res["host_profile"].items():
            print(f"{n}: host {hp['ms_per_call']:.2f} ms per call (cProfile); top own time:", flush=True)
            for row in hp["top_own"][:15]:
                print(f"   {row['own_ms_per_call']:7.3f} ms  x{row['ncalls_per_call']:6.0f}  {row['where']}", flush=True)
    if cuda and a.launch_profile:
        sizes = [r[0] * r[1] for r in reqs]
        picks = sorted({sizes.index(min(sizes)), sizes.index(max(sizes))})
        res["launch_profile"] = {}
        for n, fn in fns.items():
            with serving(fn):
                res["launch_profile"][n] = [
                    launch_profile(fn, inputs[i], (reqs[i][0], window or reqs[i][1]), a.launch_profile) for i in picks]
        for n, lps in res["launch_profile"].items():
            for lp in lps:
                print(f"{n} B={lp['batch']} T={lp['frames']}: wall {lp['wall_ms_pipelined']:.2f} ms back to back, "
                      f"{lp['wall_ms_sync']:.2f} ms synchronous; GPU {lp['gpu_ms']:.2f} ms; "
                      f"{lp['launches']:.0f} launches per call", flush=True)
                for row in lp["top_ops"][:12]:
                    print(f"   {row['cpu_us_per_call']:9.1f} us  x{row['per_call']:5.0f}  {row['op']}", flush=True)
    if cuda and a.cycle_profile:
        res["cycle_profile"] = {}
        for n, fn in fns.items():
            with serving(fn):
                res["cycle_profile"][n] = cycle_profile(fn, inputs, a.cycle_profile)
        for n, cp in res["cycle_profile"].items():
            print(f"{n}: steady ms {[round(t, 2) for t in cp['steady_ms']]}, in turn "
                  f"{[round(t, 2) for t in cp['in_turn_ms']]}; allocator per request "
                  f"{ {k: round(v, 2) for k, v in cp['allocator_delta_per_request'].items()} }", flush=True)
            for row in cp["runtime_apis"][:8]:
                print(f"   {row['cpu_us_per_request']:9.1f} us  x{row['per_request']:6.1f}  {row['api']}", flush=True)
            for row in cp["top_ops"][:8]:
                print(f"   {row['cpu_us_per_request']:9.1f} us  x{row['per_request']:6.1f}  {row['op']}", flush=True)
    if cuda and a.rounds:
        summ = {}
        for name in fns:
            summ[name] = {"pass_ms": statistics.median(res["pass_ms"][name])}
            for b in batches:  # per batch size: the median over rounds of that size's summed request times
                idx = [i for i, r in enumerate(reqs) if r[0] == b]
                per = [sum(rt[i] for i in idx) for rt in res["request_ms"][name]]
                summ[name][f"b{b}_ms"] = statistics.median(per)
        base = summ.get("fp16")
        if base:
            for name in fns:
                if name != "fp16":
                    summ[name]["vs_fp16"] = base["pass_ms"] / summ[name]["pass_ms"]
                    for b in batches:
                        summ[name][f"b{b}_vs_fp16"] = base[f"b{b}_ms"] / summ[name][f"b{b}_ms"]
        res["summary"] = summ
        print(json.dumps(summ, indent=1), flush=True)
    res["warnings"] = sorted({str(w.message)[:300] for w in seen if "oasr" in str(w.message)})
    for w in res["warnings"]:
        print("warning:", w, flush=True)
    from oasr_ops.codegen.jit import compiled_in_process

    res["jit_compiled"] = list(compiled_in_process())  # kernels nvcc built in this process (prebuilt: none)
    print(f"kernels compiled in this process: {len(res['jit_compiled'])}", flush=True)
    res["tuning_report"] = oasr_ops.tuning_report(print_=False)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Host and GPU time of the Conformer's attention call per SDPA backend (cuDNN, flash, memory-efficient), eager and
compiled by Inductor, at the shapes of serving traffic.

Why: without CUDA graphs a 1-utterance request is host-bound, and the launch profile of the compiled Conformer M
(`benchmarks/logs/sm90_e2e_serving_frz_*_s23.log`) puts `aten::_scaled_dot_product_cudnn_attention` first in host
time (16 calls, 1.1-1.4 ms of a ~8 ms forward) with 112 `aten::item` calls beside it, in fp16 Inductor and in
every oasr variant alike. This measures whether another SDPA backend costs less host time for the same result.

    python benchmarks/sdpa_host.py --out sdpa_host.json

Inputs as the model makes them (examples/conformer.py, fused qkv: a [B, T, 3d] projection viewed and permuted to
[B, H, T, hd], non-contiguous), fp16, d=512, 8 heads. Per backend: host time per call (a loop of calls without a
sync; the GPU is not the bound for the small shapes), GPU time per call (CUDA events over a loop), `aten::item`
calls per call (profiler), and the largest difference from the default backend's output.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def qkv(b: int, t: int, d: int = 512, h: int = 8, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(b, t, 3 * d, device="cuda", dtype=torch.float16, generator=g)
    return x.view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4).unbind(0)


def attend(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def host_us(fn, args, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def gpu_us(fn, args, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn(*args)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls * 1e3


def item_calls(fn, args) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(*args)
    return sum(e.count for e in prof.key_averages() if e.key == "aten::item")


def measure(fn, args, rounds: int, calls: int) -> dict:
    for _ in range(5):
        fn(*args)
    host = sorted(host_us(fn, args, calls) for _ in range(rounds))
    gpu = sorted(gpu_us(fn, args, calls) for _ in range(rounds))
    return {"host_us": host[len(host) // 2], "gpu_us": gpu[len(gpu) // 2], "item_calls": item_calls(fn, args)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x394,1x1929,16x1000", help="BxT,... (B utterances of T frames after "
                    "subsampling)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out", default="sdpa_host.json")
    a = ap.parse_args()
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for shape in a.shapes.split(","):
        b, t = (int(v) for v in shape.split("x"))
        args = qkv(b, t)
        with torch.no_grad():
            ref = attend(*args).float()
            for name, backend in BACKENDS.items():
                for compiled in ((False,) if a.no_compile else (False, True)):
                    row = {"B": b, "T": t, "backend": name, "compiled": compiled}
                    try:
                        with sdpa_kernel([backend]) if backend is not None else _null():
                            fn = attend
                            if compiled:
                                torch.compiler.reset()
                                fn = torch.compile(attend, backend="inductor", dynamic=False)
                            out = fn(*args).float()
                            row["max_abs_diff"] = (out - ref).abs().max().item()
                            row.update(measure(fn, args, a.rounds, a.calls))
                    except Exception as e:  # noqa: BLE001 - a backend that refuses the shape is a result
                        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                    res["rows"].append(row)
                    print(json.dumps(row), flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    raise SystemExit(main())

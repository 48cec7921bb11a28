"""Run the int8 implicit-GEMM conv probe (probe.cu) on the GPU: correctness against a float64 reference, then its
time at the Conformer frontend's second conv against cuDNN's fp16 conv (what `backend="oasr"` serves it with today).

    python benchmarks/conv2d_int8_probe/build.py --out DIR --jobs 16   # the probe libraries (any host with nvcc)
    python benchmarks/conv2d_int8_probe/probe.py --lib-dir DIR --out conv2d_int8_probe.json

The question (docs/perf/e2e.md, "what is left"): the second frontend conv, Conv2d(d, d, 3, stride 2) + ReLU on
[B, T/2, 39, d], is ~16 % of the int8 Conformer M forward and runs in cuDNN's fp16 implicit GEMM near the fp16
tensor-core peak. Would an int8 (wgmma) implicit GEMM pay? Nothing here is served; the probe answers before any
family work. Checks: every config's output against float64 (NaN-poisoned output, odd shapes with partial tiles);
timing: CUDA graphs of 8 calls, median of 15 replays, --rounds alternating rounds, median over rounds.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scaled_mm import time_alternating  # noqa: E402

_I = ctypes.c_int
_ARGS = [_I] * 11  # n, h, w, c, k, r, s, stride_h, stride_w, pad_h, pad_w


class Probe:
    def __init__(self, path: Path):
        self.name = path.stem.removeprefix("probe_")
        lib = ctypes.CDLL(str(path))
        lib.probe_can_implement.argtypes, lib.probe_can_implement.restype = _ARGS, _I
        lib.probe_workspace_size.argtypes, lib.probe_workspace_size.restype = _ARGS, ctypes.c_size_t
        lib.probe_run.argtypes = [ctypes.c_void_p] * 4 + _ARGS + [ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p]
        lib.probe_run.restype = _I
        self.lib = lib

    def call(self, x, w, bias, out, geo, alpha):
        ws_bytes = self.lib.probe_workspace_size(*geo)
        ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=x.device)
        rc = self.lib.probe_run(x.data_ptr(), w.data_ptr(), bias.data_ptr(), out.data_ptr(), *geo, alpha,
                                ws.data_ptr(), torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            raise RuntimeError(f"probe {self.name}: cutlass status {rc} at {geo}")


def geometry(x, w, stride, pad):
    n, h, wd, c = x.shape
    k, r, s, _ = w.shape
    return (n, h, wd, c, k, r, s, stride, stride, pad, pad)


def reference(x, w, bias, stride, pad, alpha):
    """fp16(ReLU(alpha * conv(x, w) + bias)) with the conv in float64 (int8 products: exact)."""
    acc = F.conv2d(x.permute(0, 3, 1, 2).double(), w.permute(0, 3, 1, 2).double(), stride=stride, padding=pad)
    y = torch.relu(alpha * acc + bias.double().reshape(1, -1, 1, 1))
    return y.permute(0, 2, 3, 1).float().half()


def check(probe: Probe, shape, stride, pad, gen) -> dict:
    n, h, wd, c, k = shape
    x = torch.randint(-127, 128, (n, h, wd, c), dtype=torch.int8, device="cuda", generator=gen)
    w = torch.randint(-127, 128, (k, 3, 3, c), dtype=torch.int8, device="cuda", generator=gen)
    bias = (torch.randn(k, device="cuda", generator=gen) * 0.5).half()
    alpha = 1.0 / (127.0 * 127.0 * (9 * c) ** 0.5)
    geo = geometry(x, w, stride, pad)
    if probe.lib.probe_can_implement(*geo) != 0:
        return {"shape": shape, "implementable": False}
    p = (h + 2 * pad - 3) // stride + 1
    q = (wd + 2 * pad - 3) // stride + 1
    out = torch.full((n, p, q, k), float("nan"), dtype=torch.float16, device="cuda")
    probe.call(x, w, bias, out, geo, alpha)
    torch.cuda.synchronize()
    want = reference(x, w, bias, stride, pad, alpha)
    # the kernel converts the int32 sum to fp32 (exact below 2^24) and rounds twice: allow 1 fp16 step
    tol = want.float().abs() * 2.0 ** -10 + 2.0 ** -24
    bad = ((out.float() - want.float()).abs() > tol) | out.isnan()
    return {"shape": shape, "implementable": True, "bad": int(bad.sum()), "elements": out.numel(),
            "max_abs_diff": float((out.float() - want.float()).abs().nan_to_num(float("inf")).max())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib-dir", required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--frames", type=int, default=1000)
    ap.add_argument("--channels", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--with-op", action="store_true",
                    help="also time oasr.conv2d_int8_activation on each of its tiles (the served kernels)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    probes = [Probe(p) for p in sorted(Path(a.lib_dir).glob("probe_*.so"))]
    if not probes:
        ap.error(f"no probe_*.so in {a.lib_dir}: run build.py first")
    gen = torch.Generator(device="cuda").manual_seed(0)
    c = a.channels
    h, wd = (a.frames - 1) // 2, (80 - 1) // 2  # conv1's output: [B, 499, 39, C] for 1000 frames x 80 mels
    checks = {}
    for pr in probes:
        checks[pr.name] = [check(pr, s, 2, 0, gen) for s in ((2, h, wd, c, c), (1, 37, 13, c, c), (3, 20, 39, c, c))]
        print(pr.name, checks[pr.name], flush=True)

    x = torch.randint(0, 128, (a.batch, h, wd, c), dtype=torch.int8, device="cuda", generator=gen)  # ReLU output
    w = torch.randint(-127, 128, (c, 3, 3, c), dtype=torch.int8, device="cuda", generator=gen)
    bias = (torch.randn(c, device="cuda", generator=gen) * 0.5).half()
    alpha = 1.0 / (127.0 * 127.0 * (9 * c) ** 0.5)
    geo = geometry(x, w, 2, 0)
    p, q = (h - 3) // 2 + 1, (wd - 3) // 2 + 1
    out = torch.empty((a.batch, p, q, c), dtype=torch.float16, device="cuda")
    xh = (x.float() / 127).half().permute(0, 3, 1, 2)  # NCHW view of NHWC memory: channels_last
    wh = (w.float() / 127).half().permute(0, 3, 1, 2)
    arms = {"cudnn_fp16_conv": lambda _i=0: F.conv2d(xh, wh, None, stride=2),
            "cudnn_fp16_conv_bias_relu": lambda _i=0: torch.relu(F.conv2d(xh, wh, bias, stride=2))}
    for pr in probes:
        if pr.lib.probe_can_implement(*geo) == 0:
            arms[f"int8_{pr.name}"] = (lambda pr_: lambda _i=0: pr_.call(x, w, bias, out, geo, alpha))(pr)
    if a.with_op:  # the served op (its kernels' epilogue: per-channel scale_w, per-tensor scale_x on the device)
        import oasr_ops
        from oasr_ops.families.conv2d_activation.lanes import SM90_INT8_CONV2D

        sx = torch.tensor([alpha], device="cuda")
        sw = torch.ones(c, device="cuda")
        for tile in SM90_INT8_CONV2D.ids():
            arms[f"op_{tile}"] = (lambda t: lambda _i=0: oasr_ops.conv2d_int8_activation(
                x, w, sx, sw, bias, stride=2, activation="relu", config=t))(tile)
    us, times = time_alternating(arms, a.rounds)
    flops = 2 * a.batch * p * q * c * 9 * c
    base = us["cudnn_fp16_conv"]
    print(f"\nConv2d({c}, {c}, 3, stride 2) on [{a.batch}, {h}, {wd}, {c}] NHWC -> [{a.batch}, {p}, {q}, {c}]:")
    for name in sorted(us, key=us.get):
        print(f"  {name:30s} {us[name]:9.1f} us  {flops / us[name] / 1e6:6.0f} T(FL)OPS  "
              f"{base / us[name]:.2f}x cuDNN fp16", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "date": time.strftime("%Y-%m-%d %H:%M"), "shape": [a.batch, h, wd, c], "checks": checks,
                       "us": us, "rounds_us": times}, f, indent=1)
    return 0 if all(ck.get("bad", 0) == 0 for cks in checks.values() for ck in cks) else 1


if __name__ == "__main__":
    sys.exit(main())

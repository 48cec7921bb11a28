"""Diagnosis: the fp16 sm90 default config with three epilogues vs torch.mm (bench protocol, cold weights).

v1 = the then-shipped epilogue (runtime activation switch per element), v2 = the switch hoisted per fragment
(shipped since; v1 now *is* v2), v3 = CUTLASS's stock LinearCombination (no bias/activation) — the kernel's
own speed of light. v2/v3 were one-off `.so` builds in `.jitx/` of the rendered default-config source with the
functor (v2) or the fusion and its arguments (v3) swapped by hand; results: docs/perf/gemm.md. Kept as the
record of that measurement, not as a reusable benchmark.
"""
import math
import sys
from pathlib import Path

import torch

import oasr_ops  # noqa: F401
from oasr_ops.codegen.jit import JitSpec, _load
from oasr_ops.runtime.registry import get_lane
from oasr_ops.configs import parse
from oasr_ops.tune import bench

lane = get_lane("sm90_f16_wgmma")
libs = {"v1": JitSpec.for_kernel(lane, parse("t128x128x64_c2x1_coop"), "fp16", "sm90").load()}
for v in ("v2", "v3"):
    p = Path(".jitx") / f"{v}.so"
    if p.is_file():
        libs[v] = _load(p.resolve())
ACT = {"none": 0, "silu": 3}


def call(lib, a, w, b, act):
    m, k = a.shape
    n = w.shape[0]
    out = torch.empty(m, n, dtype=a.dtype, device="cuda")
    rc = lib.run(a.data_ptr(), w.data_ptr(), None if b is None else b.data_ptr(), out.data_ptr(), m, n, k, 1,
                 ACT[act], None, 0, torch.cuda.current_stream().cuda_stream)
    assert rc == 0, rc
    return out


for m, n, k in [(16, 256, 256), (1024, 1024, 1024), (4096, 2304, 768), (4096, 4096, 1024), (16384, 4096, 1024),
                (4096, 1024, 4096)]:
    copies = bench.copies_for(n * k * 2, cold=True, cap=256)
    calls = max(8, copies)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) / math.sqrt(k) for _ in range(copies)]
    b = torch.randn(n, device="cuda", dtype=torch.float16)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    ref = torch.nn.functional.linear(a.float(), ws[0].float(), b.float())
    arms = {"torch": [lambda w=ws[j % copies]: torch.mm(a, w.t()) for j in range(calls)]}
    for v, lib in libs.items():
        for act in (("none",) if v == "v3" else ("none", "silu")):
            out = call(lib, a, ws[0], None if v == "v3" else b, act)
            r = ref if v != "v3" else torch.nn.functional.linear(a.float(), ws[0].float())
            r = torch.nn.functional.silu(r) if act == "silu" else r
            err = ((out.float() - r).abs().max() / r.abs().max()).item()
            arms[f"{v}/{act}"] = [lambda w=ws[j % copies], lib=lib, act=act, bb=(None if v == "v3" else b):
                                  call(lib, a, w, bb, act) for j in range(calls)]
            print(f"  {v}/{act} rel err {err:.2e}")
    res = bench.measure(arms, rounds=5)
    print(f"{m}x{n}x{k}: " + "  ".join(f"{name} {r.estimate.median_s * 1e6:.2f}us" for name, r in res.items()),
          flush=True)
    del ws, arms
    torch.cuda.empty_cache()
sys.exit(0)

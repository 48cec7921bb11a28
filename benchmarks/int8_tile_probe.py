"""Probe an int8 tile outside the nine-tile sm90 set at 8192^3 (evidence for the 1400 TOPS goal, not a served
config): builds `--tile` for the scaled_mm lane with the same template/epilogue, then times it against the set's
128x256 cooperative tile in one process.

    python benchmarks/int8_tile_probe.py --tile t256x128x128_c2x1_coop          # GPU (the kernel may be prebuilt)
    python benchmarks/int8_tile_probe.py --tile t256x128x128_c2x1_coop --build  # CPU: only compile it

Method: a CUDA graph of 8 calls, median of 15 replays (benchmarks/scaled_mm.py's time_graph), hot operands;
outputs of the probe and of the in-set tile must be bitwise equal (every int8 tile computes the same bits).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def probe_spec(tile: str):
    import oasr_ops  # noqa: F401
    from oasr_ops.codegen.jit import JitSpec
    from oasr_ops.runtime.registry import get_lane
    from oasr_ops.configs import parse

    lane = get_lane("sm90_int8_wgmma")
    cfg = parse(tile)
    probe_lane = dataclasses.replace(lane, name=lane.name + "_probe", space=(*lane.space, cfg))
    return JitSpec.for_kernel(probe_lane, cfg, "fp16", "sm90")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tile", default="t256x128x128_c2x1_coop")
    ap.add_argument("--build", action="store_true")
    a = ap.parse_args()
    spec = probe_spec(a.tile)
    if a.build:
        print(spec.build())
        return 0
    import torch

    from scaled_mm import time_graph

    smm = sys.modules["oasr_ops.families.scaled_mm.ops"]
    kern = smm.load_kernel(spec)
    m = n = k = 8192
    q = torch.randint(-127, 128, (m, k), device="cuda", dtype=torch.int8)
    w = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8)
    sa = torch.rand(m, device="cuda") * 0.01 + 1e-3
    sw = torch.rand(n, device="cuda") * 0.01 + 1e-3
    assert kern.can_implement(m, n, k) == 0
    ws_bytes = int(kern.workspace_size(m, n, k))
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device="cuda")

    def probe(_i=0):
        out = torch.empty(m, n, dtype=torch.float16, device="cuda")
        rc = kern.run(q.data_ptr(), w.data_ptr(), sa.data_ptr(), 1, sw.data_ptr(), 1, None, None, 0, out.data_ptr(),
                      m, n, k, ws.data_ptr(), ws_bytes, torch._C._cuda_getCurrentRawStream(0))
        assert rc == 0, rc
        return out

    def in_set(_i=0, cfg="t128x256x128_c1x1_coop"):
        return torch.ops.oasr.scaled_mm(q, w, sa, sw, None, torch.float16, cfg)

    assert torch.equal(probe(), in_set()), "probe tile computes different bits"
    flops = 2 * m * n * k
    for name, fn in ((a.tile + " (probe)", probe), ("t128x256x128_c1x1_coop", in_set),
                     ("t128x128x128_c2x1_pp", lambda i=0: in_set(i, "t128x128x128_c2x1_pp"))):
        us = time_graph(fn, 1, calls=8, reps=15)
        print(f"{name}: {us:.1f} us, {flops / us / 1e6:.0f} TOPS", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The depthwise conv1d kernel at the Conformer M conv module's shape (B=16, T=249, C=512, Kw=31, GLU prologue,
SiLU, layout btc), a few configs, eager timing; run under Nsight Compute to see where its time goes:

    ncu -k regex:dwconv -c 3 --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis \
        --section WarpStateStats python3 benchmarks/dwconv_profile.py        (device step ncu-dwconv)
"""
from __future__ import annotations

import torch

import oasr_ops  # noqa: F401
from oasr_ops.families.conv1d.ops import conv1d_depthwise

B, T, C, KW = 16, 249, 512, 31
CONFIGS = ("dw128x32_v8_n256", "dw64x32_v8_n128", "dw256x32_v8_n512")  # the lane default, the DB's pick, the largest tile


def main() -> None:
    x = torch.randn(B, T, 2 * C, device="cuda", dtype=torch.half)
    w = torch.randn(C, 1, KW, device="cuda") * KW ** -0.5
    b = torch.randn(C, device="cuda")
    for cfg in CONFIGS:
        def call():
            return conv1d_depthwise(x, w, b, layout="btc", activation="silu", config=cfg, glu=True)
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(100):
            call()
        end.record()
        torch.cuda.synchronize()
        print(f"{cfg}: {start.elapsed_time(end) * 10:.1f} us per call (eager, launch included)")


if __name__ == "__main__":
    main()

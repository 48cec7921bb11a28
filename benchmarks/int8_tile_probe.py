"""Probe int8 tiles outside the nine-tile sm90 set (evidence for extending the set, not served configs): builds each
`--tiles` entry for the scaled_mm lane with the same template and epilogue (fp16 output), then times it against
every tile of the set at each `--shapes` point, in one process.

    python benchmarks/int8_tile_probe.py --tiles t256x128x128_c2x1_coop                 # GPU, 8192^3
    python benchmarks/int8_tile_probe.py --tiles t128x128x128_c2x2_coop,t128x256x128_c2x1_coop \
        --shapes asr --jobs 16 --out int8_tile_probe.json                                  # GPU, the ASR shapes
    python benchmarks/int8_tile_probe.py --tiles t128x128x128_c2x2_coop --build           # CPU: only compile

`--shapes asr`: the FFN and projection GEMMs of the example Conformer M (B=16 x 10 s: M=3984) and Whisper-style
small (B=8: M=12000), where the e2e profiles spend their int8 GEMM time (docs/perf/e2e.md), plus 8192^3.
Why these tiles: at these shapes the set's tiles load every operand tile from L2 once per output tile (e.g. M=3984,
N=512, K=2048 on 128x128 tiles: 64 MB of L2 -> SMEM traffic for 8 GOP); a cluster's TMA multicast shares an A or
W tile between neighbouring CTAs and halves that traffic without shrinking the number of CTAs.

Method: per shape, every arm is a CUDA graph of 8 calls, median of 15 replays (benchmarks/scaled_mm.py's
time_graph), hot operands, random int8 data; `--rounds` rounds in alternating order (forward, reverse), the figure
is each arm's median over the rounds. Every probe's output must be bitwise equal to the set's 128x256 cooperative
tile (int32 accumulation: every int8 tile computes the same bits). Nothing is asserted about time.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

REFERENCE_TILE = "t128x256x128_c1x1_coop"
ASR_SHAPES = (
    (3984, 2048, 512),    # Conformer M FFN fc1 (d=512, x4)
    (3984, 512, 2048),    # Conformer M FFN fc2
    (3984, 1536, 512),    # Conformer M q/k/v as one GEMM
    (3984, 1024, 512),    # Conformer M conv-module pointwise1 (GLU: 2d)
    (12000, 3072, 768),   # Whisper small fc1
    (12000, 768, 3072),   # Whisper small fc2
    (12000, 768, 768),    # Whisper small q / k / v / out
    (8192, 8192, 8192),
)


def probe_specs(tiles: list[str]):
    """One JitSpec per probe tile: the sm90 int8 lane with the tile appended to its space (the lane's
    validation of a config is its space membership), variant fp16."""
    import oasr_ops  # noqa: F401  (registers the lanes)
    from oasr_ops.codegen.jit import JitSpec
    from oasr_ops.configs import parse
    from oasr_ops.runtime.registry import get_lane

    lane = get_lane("sm90_int8_wgmma")
    cfgs = [parse(t) for t in tiles]
    known = {c.id for c in lane.space}
    inside = [c.id for c in cfgs if c.id in known]
    if inside:
        raise SystemExit(f"--tiles: {inside} are in the set already (they are timed anyway)")
    probe_lane = dataclasses.replace(lane, name=lane.name + "_probe", space=(*lane.space, *cfgs))
    return lane, {c.id: JitSpec.for_kernel(probe_lane, c, "fp16", "sm90") for c in cfgs}


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    if text == "asr":
        return list(ASR_SHAPES)
    out = []
    for part in text.split(","):
        try:
            m, n, k = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--shapes: {part!r} is not MxNxK") from None
        if min(m, n, k) < 1 or k % 16 or n % 16:
            raise SystemExit(f"--shapes: {part!r}: M >= 1, N and K multiples of 16")
        out.append((m, n, k))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiles", default="t256x128x128_c2x1_coop", help="probe tiles, comma-separated")
    ap.add_argument("--shapes", default="8192x8192x8192", help="MxNxK,... or 'asr'")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=None, help="parallel nvcc builds of the probe kernels")
    ap.add_argument("--build", action="store_true", help="only compile the probe kernels (no GPU needed)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from oasr_ops.codegen.jit import JitSpec, build_many

    lane, specs = probe_specs([t for t in a.tiles.split(",") if t])
    in_set = [c.id for c in lane.space]
    builds = list(specs.values())
    if not a.build:  # the set's fp16 kernels too, so no arm builds inside a timed round
        builds += [JitSpec.for_kernel(lane, c, "fp16", "sm90") for c in lane.space]
    rep = build_many(builds, jobs=a.jobs, progress=False)
    print(rep.summary(), flush=True)
    if rep.failed:
        return 1
    if a.build:
        return 0

    import torch
    from scaled_mm import time_alternating

    smm = sys.modules["oasr_ops.families.scaled_mm.ops"]
    kernels = {t: smm.load_kernel(s) for t, s in specs.items()}
    rows = []
    for m, n, k in parse_shapes(a.shapes):
        gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 3 + k)
        q = torch.randint(-127, 128, (m, k), device="cuda", dtype=torch.int8, generator=gen)
        w = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8, generator=gen)
        sa = torch.rand(m, device="cuda", generator=gen) * 0.01 + 1e-3
        sw = torch.rand(n, device="cuda", generator=gen) * 0.01 + 1e-3

        def probe_call(kern):
            if kern.can_implement(m, n, k) != 0:
                return None
            ws_bytes = int(kern.workspace_size(m, n, k))
            ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device="cuda")

            def call(_i=0):
                out = torch.empty(m, n, dtype=torch.float16, device="cuda")
                rc = kern.run(q.data_ptr(), w.data_ptr(), sa.data_ptr(), 1, sw.data_ptr(), 1, None, None, 0,
                              out.data_ptr(), m, n, k, ws.data_ptr(), ws_bytes,
                              torch._C._cuda_getCurrentRawStream(0))
                if rc != 0:
                    raise RuntimeError(f"probe kernel returned {rc} at {m}x{n}x{k}")
                return out
            return call

        arms = {f"{t} (probe)": probe_call(kern) for t, kern in kernels.items()}
        skipped = [name for name, fn in arms.items() if fn is None]
        arms = {name: fn for name, fn in arms.items() if fn is not None}
        for cfg in in_set:
            arms[cfg] = (lambda c: lambda _i=0: torch.ops.oasr.scaled_mm(q, w, sa, sw, None, torch.float16, c))(cfg)
        want = arms[REFERENCE_TILE]()
        for name, fn in arms.items():
            got = fn()
            torch.cuda.synchronize()
            if not torch.equal(got, want):
                raise SystemExit(f"{name} computes different bits from {REFERENCE_TILE} at {m}x{n}x{k}")
        us, times = time_alternating(arms, a.rounds)
        best_set = min(in_set, key=lambda c: us[c])
        flops = 2 * m * n * k
        print(f"\n{m}x{n}x{k}: best in set {best_set} {us[best_set]:.2f} us ({flops / us[best_set] / 1e6:.0f} TOPS)"
              + (f"; cannot implement: {skipped}" if skipped else ""), flush=True)
        for name in sorted(us, key=us.get):
            print(f"  {name:34s} {us[name]:8.2f} us  {flops / us[name] / 1e6:6.0f} TOPS  "
                  f"{us[best_set] / us[name]:.3f}x best-in-set", flush=True)
        rows.append({"M": m, "N": n, "K": k, "us": us, "rounds_us": times, "best_in_set": best_set,
                     "cannot_implement": skipped})
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "date": time.strftime("%Y-%m-%d %H:%M"), "tiles": list(specs), "rounds": a.rounds,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

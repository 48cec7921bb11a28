"""Build the int8 implicit-GEMM conv probe (probe.cu), one shared library per tile config, with the flags
oasr_ops's JIT builds its CUTLASS kernels with (`codegen.jit.nvcc_flags`: -O3 -DNDEBUG, the nvidia-cutlass
headers; without -DNDEBUG the device asserts are calls inside the mainloop and ptxas serializes the wgmmas).

    python benchmarks/conv2d_int8_probe/build.py --out DIR [--jobs 16]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from oasr_ops.codegen.jit import nvcc_flags  # noqa: E402
from oasr_ops.paths import nvcc_path  # noqa: E402

HERE = Path(__file__).resolve().parent
# (tile M, tile N, cluster M): CUTLASS 4.2's sm90 conv has one schedule (non-persistent, TileM / 64 consumer
# warpgroups), so the tile and the cluster are the only knobs
CONFIGS = ((128, 128, 1), (128, 128, 2), (128, 256, 1), (128, 256, 2), (64, 256, 1), (64, 128, 1))


def build(cfg: tuple[int, int, int], out: Path) -> tuple[str, int, str]:
    tm, tn, cm = cfg
    name = f"probe_{tm}x{tn}_c{cm}"
    cmd = [nvcc_path() or "nvcc", *nvcc_flags("90a"), f"-DPROBE_TILE_M={tm}", f"-DPROBE_TILE_N={tn}",
           f"-DPROBE_CLUSTER_M={cm}", str(HERE / "probe.cu"), "-o", str(out / f"{name}.so")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return name, r.returncode, r.stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(a.jobs) as pool:
        results = list(pool.map(lambda c: build(c, out), CONFIGS))
    failed = 0
    for name, rc, err in results:
        notes = [ln for ln in err.splitlines() if "error" in ln or "C7510" in ln]
        print(f"{name}: {'ok' if rc == 0 else 'FAILED'}" + "".join(f"\n  {ln[:300]}" for ln in notes[:5]), flush=True)
        failed += rc != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

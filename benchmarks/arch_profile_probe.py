"""Probe this GPU's ArchProfile (runtime/arch_profile.py) and write it as JSON.

    python benchmarks/arch_profile_probe.py OUT.json [--device 0] [--no-cache]

Prints the probed numbers beside the static table's entry for the same SKU (or the family reference), so a
spec-sheet value that is far from what the device does shows up. Needs a CUDA GPU; takes ~10-20 s uncached.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from oasr_ops.runtime import arch_profile as ap  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="JSON path to write the probed profile to")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--no-cache", action="store_true", help="measure even if a cached probe exists")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA GPU here (the probe measures the device)", file=sys.stderr)
        return 2
    prof = ap.probe_profile(args.device, use_cache=not args.no_cache)
    ref = ap.static_profile(prof.sku)
    if ref is None:
        try:
            ref = ap.reference_profile(prof.arch_family)
        except ValueError:
            ref = None
    rows = [("sm_count", prof.sm_count, ref and ref.sm_count, 1),
            ("smem_per_sm KiB", prof.smem_per_sm_bytes / 1024, ref and ref.smem_per_sm_bytes / 1024, 1),
            ("L2 MiB", prof.l2_bytes / 2**20, ref and ref.l2_bytes / 2**20, 1),
            ("sm_clock MHz", prof.sm_clock_mhz, ref and ref.sm_clock_mhz, 1),
            ("DRAM TB/s", prof.dram_bw_bytes_s, ref and ref.dram_bw_bytes_s, 1e12),
            ("L2 TB/s", prof.l2_bw_bytes_s, ref and ref.l2_bw, 1e12)]
    rows += [(f"{d} dense T(FL)OPS", prof.peak_ops_s.get(d, 0.0), ref and ref.peak_ops_s.get(d, 0.0), 1e12)
             for d in ap.DTYPES]
    rows += [("graph launch us", prof.graph_launch_s, ref and ref.graph_launch_s, 1e-6),
             ("eager launch us", prof.eager_launch_s, ref and ref.eager_launch_s, 1e-6)]
    print(f"{prof.sku} ({prof.arch_family}), torch {torch.__version__}, driver {ap._driver_version()}")
    print(f"{'':24s}{'probed':>12s}{'static: ' + (ref.sku if ref else '-'):>32s}")
    for name, v, r, unit in rows:
        print(f"{name:24s}{v / unit:12.3f}{'' if r is None else f'{r / unit:32.3f}'}")
    Path(args.out).write_text(json.dumps(prof.to_dict(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write copies of census files keeping only the signatures of the given ops, so that `oasr tune prebuild` /
`oasr tune build` measure those sites alone (the device step `build-act-quant`: the fused fc1s of the calibrated
censuses, op ``scaled_mm_quant`` / ``scaled_mm_fp8_quant``, without re-measuring the plain GEMMs the shipped DB
already holds).

  python benchmarks/census_ops.py --ops scaled_mm_quant,scaled_mm_fp8_quant --out-dir DIR CENSUS.json [...]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from oasr_ops.runtime.database import parse_signature
from oasr_ops.tune.census_file import load_census


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("censuses", nargs="+")
    p.add_argument("--ops", required=True, help="comma-separated ops whose signatures are kept")
    p.add_argument("--out-dir", required=True)
    a = p.parse_args()
    ops = {o for o in a.ops.split(",") if o}
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in a.censuses:
        doc = load_census(path)
        kept = {s: body for s, body in doc["signatures"].items()
                if (parts := parse_signature(s)) is not None and parts.op in ops}
        (out_dir / Path(path).name).write_text(json.dumps({**doc, "signatures": kept}, indent=1))
        print(f"{path}: {len(kept)} of {len(doc['signatures'])} signatures kept")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

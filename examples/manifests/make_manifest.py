"""Generate ``librispeech_like_200.jsonl``: synthetic utterance durations for a workload census.

Durations are log-normal (median 7 s, sigma 0.6 in log space) clipped to [1, 30] s and rounded to 10 ms
(one feature frame), drawn with the standard library's ``random.Random(seed)`` so the file is reproducible
on any Python 3 without numpy. Re-running with the defaults rewrites the committed file byte for byte::

    python examples/manifests/make_manifest.py            # rewrite
    python examples/manifests/make_manifest.py --check    # exit 1 if the committed file differs
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_OUT = Path(__file__).with_name("librispeech_like_200.jsonl")


@dataclass(frozen=True)
class ManifestSpec:
    n: int = 200
    seed: int = 0
    median_s: float = 7.0   # log-normal median = exp(mu)
    sigma: float = 0.6      # log-space std; gives a ~2.6-19 s central 90% range, roughly LibriSpeech-shaped
    min_s: float = 1.0
    max_s: float = 30.0


def durations(spec: ManifestSpec = ManifestSpec()) -> list[float]:
    rng = random.Random(spec.seed)
    mu = math.log(spec.median_s)
    # Clip rather than resample: it keeps the i-th duration a function of the seed and i alone.
    return [round(min(max(rng.lognormvariate(mu, spec.sigma), spec.min_s), spec.max_s), 2) for _ in range(spec.n)]


def render(spec: ManifestSpec = ManifestSpec()) -> str:
    return "".join(json.dumps({"duration": d}) + "\n" for d in durations(spec))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = ManifestSpec()
    ap.add_argument("--n", type=int, default=d.n)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--median", type=float, default=d.median_s)
    ap.add_argument("--sigma", type=float, default=d.sigma)
    ap.add_argument("--min", type=float, default=d.min_s)
    ap.add_argument("--max", type=float, default=d.max_s)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    a = ap.parse_args(argv)
    text = render(ManifestSpec(a.n, a.seed, a.median, a.sigma, a.min, a.max))
    if a.check:
        same = a.out.exists() and a.out.read_text() == text
        print(f"{a.out}: {'up to date' if same else 'DIFFERS from the generator'}")
        return 0 if same else 1
    a.out.write_text(text)
    print(f"wrote {a.n} durations to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

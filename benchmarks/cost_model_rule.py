"""How the model tier's decision rule was chosen: leave-one-signature-out on the H200 build log (CPU only).

  python benchmarks/cost_model_rule.py [benchmarks/logs/sm90_gemm_build.jsonl]

For each held-out signature the calibration is fitted on the other 17 (tune/calibrate.fit), then every point of
the held-out signature is answered by `cost_model.choose` among the arms measured there with a gate, and sent to
cuBLAS when the predicted cuBLAS time is under a floor. Printed per (gate, floor): the measured speed of the answer
vs cuBLAS (geomean, min, points under 0.9x), regret vs the measured best arm, and how many answers were CUTLASS.
"""
from __future__ import annotations

import json
import math
import sys
from collections import defaultdict

from oasr_ops.runtime import cost_model as cm
from oasr_ops.runtime.arch_profile import reference_profile
from oasr_ops.tune import calibrate


def main(path: str = "benchmarks/logs/sm90_gemm_build.jsonl") -> int:
    recs = [json.loads(line) for line in open(path)]
    prof = reference_profile("sm90")
    arms_at: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for r in recs:
        arms_at[(r["signature"], r["m"])][r["config"]] = r["median_s"]
    sigs = sorted({s for s, _ in arms_at})
    cals = {h: calibrate.fit([r for r in recs if r["signature"] != h], prof) for h in sigs}
    gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
    for gate in (0.1, 0.2, 0.3):
        for floor_us in (0.0, 10.0, 30.0, 100.0):
            speed, regret, cutlass = [], [], 0
            for (sig, m), arms in arms_at.items():
                act, dt, n, k = calibrate._sig_shape(sig)
                cal = cals[sig]
                ids = [c for c in arms if c not in ("torch", "default")]
                c = cm.choose(ids, m, n, k, dt, prof, cal, gate, activation=act)
                if c != "torch" and cm.predict_us("torch", m, n, k, dt, prof, cal, activation=act) < floor_us:
                    c = "torch"
                cutlass += c != "torch"
                speed.append(arms["torch"] / arms[c])
                regret.append(arms[c] / min(arms.values()))
            print(f"gate {gate:.2f} floor {floor_us:5.0f} us: vs cuBLAS geomean {gm(speed):.4f} min {min(speed):.3f}"
                  f" (<0.9x: {sum(s < 0.9 for s in speed)}), regret geomean {gm(regret) - 1:.4f} max"
                  f" {max(regret) - 1:.3f}, CUTLASS answers {cutlass}/{len(speed)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))

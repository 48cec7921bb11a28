"""Fit the cost model (runtime/cost_model.py) from a build's measurement log, and score it.

Input: the JSONL log `oasr tune build` appends (one record per arm per point: signature, m, config, median_s,
weight, ...; evaluate.read_log reads it). Per CUTLASS config: non-negative least squares of the measured time
(less the structural launch and fixup terms) on the structure's features (W*r, W*r*k_iters, 1), rows scaled by
1/T so the fit minimises relative error. The "torch" arm's records fit the cuBLAS curve (`fit_torch_curve`).

`model_regret` scores the model tier against the measured oracle (evaluate's statistics: weighted geomean,
p95, max; plus how often it picked torch vs a CUTLASS config); `loso_regret` refits leaving each signature out.
`python -m oasr_ops.tune.calibrate LOG --arch sm90` prints all of it. numpy only (no scipy).
"""
from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..configs import ConfigError, parse
from ..runtime import cost_model as cm
from ..runtime.arch_profile import ArchProfile, normalize_dtype, reference_profile
from ..runtime.database import parse_signature
from .evaluate import evaluate, read_log

_DT = {"half": "fp16", "fp16": "fp16", "bf16": "bf16"}


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson-Hanson active set)."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    tol = 1e-12 * max(1.0, float(np.abs(a).max(initial=0.0))) * max(m, n)
    for _ in range(max_iter):
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                break
            # step back toward x until a passive coefficient reaches zero, drop it from the passive set
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / np.maximum(x[neg] - z[neg], 1e-300))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = z
        w = a.T @ (b - a @ x)
    return x


def _sig_shape(sig: str) -> tuple[bool, str, int, int] | None:
    """`gemm|op=gemm_activation|dt=half|N=1024|K=256` -> (activation, dtype, N, K); None for other families."""
    parts = parse_signature(sig)
    if parts is None or parts.family != "gemm":
        return None
    return parts.op == "gemm_activation", _DT[parts.dt], parts.n, parts.k


def _rows(records: Iterable[Mapping[str, Any]]) -> list[tuple[str, int, int, int, bool, str, str, float]]:
    """(signature, m, n, k, activation, dtype, config, seconds); the last record of an arm at a point wins."""
    last: dict[tuple[str, int, str], float] = {}
    for r in records:
        try:
            sig, m, cfg, t = str(r["signature"]), int(r["m"]), str(r["config"]), float(r["median_s"])
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(t) and t > 0:
            last[(sig, m, cfg)] = t
    out = []
    for (sig, m, cfg), t in last.items():
        sh = _sig_shape(sig)
        if sh is not None:
            act, dt, n, k = sh
            out.append((sig, m, n, k, act, dt, cfg, t))
    return out


def fit_configs(rows, profile: ArchProfile) -> dict[str, tuple[float, float, float]]:
    """Per-config (a, b, R) seconds by relative-error NNLS on (W*r, W*r*k_iters, 1)."""
    by_cfg: dict[str, list[tuple[list[float], float]]] = defaultdict(list)
    for _sig, m, n, k, _act, dt, cid, t in rows:
        if cid in cm.TORCH_ARMS:
            continue
        try:
            cfg = parse(cid)
        except ConfigError:
            continue  # sentinels ("default") and foreign ids carry no structure
        st = cm.structure(cfg, m, n, k, dt, profile)
        if st is None:
            continue
        y = t - st.launches * profile.graph_launch_s - st.red_s
        by_cfg[cid].append(([st.x_a / t, st.x_b / t, 1.0 / t], y / t))
    out = {}
    for cid, data in by_cfg.items():
        if len(data) < 3:
            continue
        a = np.array([d[0] for d in data])
        b = np.array([d[1] for d in data])
        scale = a.max(axis=0)  # column scaling: the features span nanoseconds to tens of thousands
        x = nnls(a / scale, b) / scale
        out[cid] = (float(x[0]), float(x[1]), float(x[2]))
    return out


def fit_table(table: Mapping[int, Mapping[str, float]], n: int, k: int, dtype: str,
              profile: ArchProfile) -> dict[str, tuple[float, float, float]]:
    """`fit_configs` on one signature's measured medians ``{m: {config: seconds}}`` (any family whose tiles the
    structure describes, as `dtype` GEMMs): per-config (a, b, R) from that signature's points alone, so a build
    and ``--from-log`` of its log fit the same numbers. With N and K fixed, W*r and W*r*k_iters are proportional
    (a non-Stream-K config's time is fitted as cost per wave round + a constant); a config measured at fewer than
    three points gets nothing."""
    rows = [("", int(m), n, k, False, dtype, cid, float(t)) for m, row in table.items() for cid, t in row.items()]
    return fit_configs(rows, profile)


def fit_structure(rows, profile: ArchProfile) -> tuple[float, float, float] | None:
    """One (alpha, beta, R) for all configs: relative-error NNLS of the time on
    (W*r * a_default, W*r*k_iters * b_default, 1)."""
    xs, ys = [], []
    for _sig, m, n, k, _act, dt, cid, t in rows:
        if cid in cm.TORCH_ARMS:
            continue
        try:
            cfg = parse(cid)
        except ConfigError:
            continue
        st = cm.structure(cfg, m, n, k, dt, profile)
        if st is None:
            continue
        a0, b0, _ = cm.default_coefficients(cfg, dt, profile)
        xs.append([st.x_a * a0 / t, st.x_b * b0 / t, 1.0 / t])
        ys.append((t - st.launches * profile.graph_launch_s - st.red_s) / t)
    if len(xs) < 3:
        return None
    a, b = np.array(xs), np.array(ys)
    scale = a.max(axis=0)
    x = nnls(a / scale, b) / scale
    return float(x[0]), float(x[1]), float(x[2])


def _torch_residual(curve: cm.TorchCurve, pts, profile) -> float:
    errs = [math.log(cm.predict_torch_s(m, n, k, dt, profile, cm.Calibration("", torch=curve), activation=act) / t)
            for m, n, k, act, dt, t in pts]
    return float(np.sqrt(np.mean(np.square(errs))))


def fit_torch_curve(rows, profile: ArchProfile) -> cm.TorchCurve | None:
    """The cuBLAS efficiency curve from the "torch" arm: for each candidate fixed overhead, a least-squares fit
    of logit(eff / e_max) on (1, log2 M, log2 N*K) over the compute-bound points (c1, c2 clipped at 0: monotone), keeping
    the (overhead, saturation, bandwidth efficiency) grid point whose curve has the smallest RMS log error over all torch points."""
    pts = [(m, n, k, act, dt, t) for _s, m, n, k, act, dt, cid, t in rows if cid == "torch"]
    if len(pts) < 4:
        return None
    best: tuple[float, cm.TorchCurve] | None = None
    grid = [(o, e, x) for o in np.arange(0.0, 3.01e-6, 0.4e-6) for e in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
            for x in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)]
    for ov, bw_eff, e_max in grid:
        xs, ys = [], []
        for m, n, k, act, dt, t in pts:
            eb = cm.OPERAND_BYTES[dt]
            y = t - ov - profile.graph_launch_s
            if act:
                y -= profile.graph_launch_s + 2.0 * m * n * cm.OUT_BYTES / profile.dram_bw_bytes_s
            floor = ((m * k + n * k) * eb + m * n * cm.OUT_BYTES) / (profile.dram_bw_bytes_s * bw_eff)
            if y <= 1.05 * floor:
                continue  # memory-bound (or pure overhead): says nothing about efficiency
            eff = min(max(2.0 * m * n * k / (profile.peak(dt) * y * e_max), 1e-5), 0.999)
            xs.append([1.0, math.log2(m), math.log2(n * k)])
            ys.append(math.log(eff / (1.0 - eff)))
        if len(xs) < 3:
            continue
        a, b = np.array(xs), np.array(ys)
        c = np.linalg.lstsq(a, b, rcond=None)[0]
        for j in (1, 2):  # enforce monotone: refit without a column whose slope came out negative
            if c[j] < 0:
                keep = [i for i in range(3) if i != j and (i == 0 or c[i] >= 0)]
                c = np.zeros(3)
                c[keep] = np.linalg.lstsq(a[:, keep], b, rcond=None)[0]
        c[1:] = np.maximum(c[1:], 0.0)
        curve = cm.TorchCurve(float(c[0]), float(c[1]), float(c[2]), float(ov), float(e_max), float(bw_eff))
        err = _torch_residual(curve, pts, profile)
        if best is None or err < best[0]:
            best = (err, curve)
    return best[1] if best else None


def fit(records: Iterable[Mapping[str, Any]], profile: ArchProfile, *, configs: bool = True) -> cm.Calibration:
    """A Calibration from log records (gemm family): the torch curve, the structure's global scale and (unless
    `configs=False`) per-config coefficients."""
    rows = _rows(records)
    dts = {r[5] for r in rows}
    dtype = dts.pop() if len(dts) == 1 else "fp16"
    cal = cm.Calibration(arch_family=profile.arch_family, dtype=normalize_dtype(dtype), sku=profile.sku,
                         configs=fit_configs(rows, profile) if configs else {},
                         torch=fit_torch_curve(rows, profile), structure=fit_structure(rows, profile))
    cal.meta = {"points": len({(r[0], r[1]) for r in rows}), "records": len(rows),
                "signatures": len({r[0] for r in rows})}
    return cal


# ---------------------------------------------------------------------------------------------- scoring

def model_selector(records: Iterable[Mapping[str, Any]], calibration: cm.Calibration | None, profile: ArchProfile,
                   gate: float = 0.02, candidates: str = "measured"):
    """(signature, m) -> the model's choice among the arms measured at that point (torch included)."""
    arms: dict[tuple[str, int], list[str]] = defaultdict(list)
    for sig, m, _n, _k, _a, _d, cid, _t in _rows(records):
        arms[(sig, m)].append(cid)

    def select(sig: str, m: int) -> str | None:
        sh = _sig_shape(sig)
        if sh is None:
            return None
        act, dt, n, k = sh
        cands = [c for c in sorted(arms.get((sig, m), [])) if c not in cm.TORCH_ARMS and c != "default"]
        return cm.choose(cands, m, n, k, dt, profile, calibration, gate, activation=act)

    return select


def _summary(score, picks: dict[str, int]) -> dict[str, Any]:
    regs = [p.regret for p in score.points if p.regret is not None]
    plain = math.exp(sum(math.log1p(r) for r in regs) / len(regs)) - 1.0 if regs else None
    return {"n": score.n, "geomean_weighted": score.geomean, "geomean": plain, "p95": score.p95,
            "max": score.max, "unmeasured": score.unmeasured, "picks": dict(picks)}


def model_regret(log_records: Iterable[Mapping[str, Any]], calibration: cm.Calibration | None,
                 profile: ArchProfile, gate: float = 0.02) -> dict[str, Any]:
    """The model tier's regret vs the measured oracle (the fastest measured arm per point):
    {"n", "geomean_weighted" (traffic weights, as `oasr tune evaluate`), "geomean" (unweighted), "p95", "max",
    "picks": {"torch": .., "cutlass": ..}}. Regrets are fractions (0.05 = 5 % slower than the oracle)."""
    recs = list(log_records)
    sel = model_selector(recs, calibration, profile, gate)
    score = evaluate(recs, {"model": sel})["selectors"]["model"]
    picks = {"torch": 0, "cutlass": 0}
    for p in score.points:
        if p.config is not None:
            picks["torch" if p.config in cm.TORCH_ARMS else "cutlass"] += 1
    return _summary(score, picks)


def loso_regret(log_records: Iterable[Mapping[str, Any]], profile: ArchProfile, gate: float = 0.02,
                *, configs: bool = True) -> dict[str, Any]:
    """Leave-one-signature-out: each signature's points chosen by a calibration fitted on the others."""
    recs = list(log_records)
    sigs = sorted({str(r.get("signature")) for r in recs})
    by_sig: dict[str, list] = defaultdict(list)
    for r in recs:
        by_sig[str(r.get("signature"))].append(r)
    choices: dict[tuple[str, int], str | None] = {}
    for s in sigs:
        cal = fit([r for r in recs if r.get("signature") != s], profile, configs=configs)
        sel = model_selector(by_sig[s], cal, profile, gate)
        for m in {int(r["m"]) for r in by_sig[s]}:
            choices[(s, m)] = sel(s, m)
    score = evaluate(recs, {"loso": lambda s, m: choices.get((s, int(m)))})["selectors"]["loso"]
    picks = {"torch": 0, "cutlass": 0}
    for p in score.points:
        if p.config is not None:
            picks["torch" if p.config in cm.TORCH_ARMS else "cutlass"] += 1
    return _summary(score, picks)


def cutlass_top1_regret(log_records: Iterable[Mapping[str, Any]], calibration: cm.Calibration | None,
                        profile: ArchProfile) -> dict[str, Any]:
    """The spec's structure metric: the model's top-1 CUTLASS config vs the best measured CUTLASS config
    (torch left out of both)."""
    recs = [r for r in log_records if r.get("config") not in cm.TORCH_ARMS]
    arms: dict[tuple[str, int], list[str]] = defaultdict(list)
    for sig, m, _n, _k, _a, _d, cid, _t in _rows(recs):
        arms[(sig, m)].append(cid)

    def sel(sig: str, m: int) -> str | None:
        act, dt, n, k = _sig_shape(sig)  # type: ignore[misc]
        r = cm.rank(sorted(arms[(sig, m)]), m, n, k, dt, profile, calibration, activation=act)
        return r[0][0] if r else None

    score = evaluate(recs, {"top1": sel})["selectors"]["top1"]
    return _summary(score, {"cutlass": score.n})


def _fmt(d: Mapping[str, Any]) -> str:
    f = lambda x: "-" if x is None else f"{100 * x:.2f}%"  # noqa: E731
    return (f"geomean {f(d['geomean'])} (traffic-weighted {f(d['geomean_weighted'])}), p95 {f(d['p95'])}, "
            f"max {f(d['max'])}, n={d['n']}, picks {d['picks']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m oasr_ops.tune.calibrate",
                                 description="fit the cost model on a build log and report its regret")
    ap.add_argument("log")
    ap.add_argument("--arch", default="sm90", help="the log's arch family (its reference SKU's static profile)")
    ap.add_argument("--gate", type=float, default=0.02)
    ap.add_argument("--out", help="write the calibration JSON (a tuning file's model section) here")
    args = ap.parse_args(argv)
    try:
        recs = read_log(args.log)
        prof = reference_profile(args.arch)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    recs = [r for r in recs if isinstance(r, dict) and isinstance(r.get("signature"), str)
            and _sig_shape(r["signature"]) is not None]
    if not recs:  # e.g. a conv1d or scaled_mm build's log: the selectors below would have no shape to rank
        print(f"error: {args.log}: no record of the gemm family (this tool fits the gemm family's cost model)",
              file=sys.stderr)
        return 2
    cal = fit(recs, prof)
    glob = fit(recs, prof, configs=False)
    print(f"{args.log}: {cal.meta}; profile {prof.sku} ({prof.source})")
    print(f"  torch curve {cal.torch}; structure scale {cal.structure}")
    rows = [
        ("CUTLASS top-1 vs best CUTLASS, uncalibrated structure", cutlass_top1_regret(recs, None, prof)),
        ("CUTLASS top-1 vs best CUTLASS, scaled structure (in-sample)", cutlass_top1_regret(recs, glob, prof)),
        ("CUTLASS top-1 vs best CUTLASS, per-config (in-sample)", cutlass_top1_regret(recs, cal, prof)),
        ("model tier, uncalibrated (default torch curve)", model_regret(recs, None, prof, args.gate)),
        ("model tier, scaled structure + torch curve (in-sample)", model_regret(recs, glob, prof, args.gate)),
        ("model tier, scaled structure + torch curve (leave-one-signature-out)",
         loso_regret(recs, prof, args.gate, configs=False)),
        ("model tier, per-config (in-sample)", model_regret(recs, cal, prof, args.gate)),
        ("model tier, per-config (leave-one-signature-out)", loso_regret(recs, prof, args.gate)),
    ]
    for name, d in rows:
        print(f"{name}:\n    {_fmt(d)}")
    if args.out:
        import json
        from pathlib import Path

        from ..paths import write_text_atomic

        write_text_atomic(Path(args.out), json.dumps(cm.to_json(cal), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

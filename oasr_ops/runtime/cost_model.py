"""The cost model (spec "The cost model"): predicted time of a CUTLASS config or of cuBLAS for one GEMM shape.

    T(c; M,N,K) = max(W * r * (a_c + b_c * k_iters) + R_c + red_c,  bytes / BW) + launches * L_graph

Structure (`structure()`), per config c with tile (tm, tn, tk), cluster (cm, cn) and split s:

* tiles = ceil(M/tm) * ceil(N/tn), each side rounded up to the cluster shape (the grid is launched in clusters);
  k_tiles = ceil(K/tk); k_iters = ceil(k_tiles / s).
* Rule 1: a split larger than the K-tile count is infeasible (`structure` returns None, `predict_us` inf).
* CTAs = tiles * s run in waves over `slots = sms * ctas_per_sm` (sms: the SMs usable by whole clusters).
  A full wave has r = ctas_per_sm CTAs sharing each SM, so it costs r per-CTA K-loops.
  Rule 2: a partial wave's CTAs do not share an SM: its `rem` CTAs are spread one per SM, costing
  ceil(rem / sms) K-loops, not rem / slots of a full wave. Hence W * r = full * ctas_per_sm + ceil(rem / sms)
  (`Structure.waves` is W, `Structure.r` the mean residency that makes the product).
* Stream-K (schedule "streamk") follows CUTLASS's heuristic: full waves run data-parallel; the remaining tiles'
  k-iterations are spread over up to one wave of SK units, each at least MIN_ITERS_PER_SK_UNIT long; the
  K-loop term counts the balanced iterations per SM, and `red` the partial-sum fixup.
* Serial split-K (2.x `_kN`) pays `red` for the partial sums too.
* bytes = (M*K + N*K) * operand bytes + M*N * 2 (fp16 output); BW = DRAM bandwidth.
* A swap-AB config (fp8 ``_swab``) runs the transposed problem D^T = W . A^T: M and N trade places (its tile's M
  runs over the GEMM's N, its N over the tokens).

Coefficients. Uncalibrated (`default_coefficients`): b_c = max(tile flops per k-iter / per-SM peak, operand
bytes per k-iter / per-SM L2 feed), with cluster multicast dividing the shared operand's bytes; a_c = a fixed
per-tile overhead (pipeline fill + epilogue sync) + the output tile's write at the per-SM feed rate; R_c = 0.
This ranks configs with no measurement. A `Calibration` holds fitted (a, b, R) per config (tune/calibrate.py,
from a build's measurement log) and a fitted cuBLAS efficiency curve per arch (`TorchCurve`):

    T(torch) = max(flops / (peak * eff(M, N, K)), bytes / (BW * bw_eff)) + overhead + launches * L_graph
    eff = e_max / (1 + exp(-(c0 + c1 * log2 M + c2 * log2(N * K))))    c1, c2 >= 0: eff never falls with size

A gemm_activation's torch arm is cuBLAS plus an eager activation kernel (one more launch, M*N read + written).

`choose()` answers "torch" unless the best CUTLASS candidate is predicted faster than torch by more than the
gate: T(torch) > (1 + gate) * T(best). Pure Python, no torch import: the runtime tier calls it per new shape.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..configs import Config, ConfigError, parse
from .arch_profile import ArchProfile, normalize_dtype

TORCH_ARMS = ("torch", "fused")
OPERAND_BYTES = {"fp16": 2, "bf16": 2, "int8": 1, "fp8": 1}
OUT_BYTES = 2  # every family writes fp16/bf16
ACC_BYTES = 4  # fp32 / int32 partial sums of split-K and Stream-K

PER_TILE_OVERHEAD_S = 0.5e-6  # pipeline fill (first TMA loads: DRAM latency) + epilogue barrier, typical
MIN_ITERS_PER_SK_UNIT = 8  # CUTLASS's Stream-K scheduler does not make a unit shorter than this
SK_SYNC_S = 1.0e-6  # Stream-K / split-K fixup: the finishing CTA waits on the others' flags

# The torch curve used without a calibration: fitted (tune/calibrate.fit_torch_curve) on the H200 fp16 build
# log benchmarks/logs/sm90_gemm_build.jsonl, 180 points; relative to the profile's peak, so other SKUs scale.
DEFAULT_TORCH_CURVE: dict[str, float] = {"c0": -14.37, "c1": 0.599, "c2": 0.432, "overhead_s": 0.4e-6,
                                         "e_max": 0.7, "bw_eff": 0.5}


# ---------------------------------------------------------------------------------------------- structure

@dataclass(frozen=True)
class Structure:
    tiles: int
    split: int  # K slices per tile (1 = data-parallel)
    k_iters: int  # K-loop iterations per CTA (Stream-K: balanced iterations per SM in its SK part)
    waves: int  # W
    r: float  # mean CTAs resident per SM per wave; W * r = x_a
    x_a: float  # W * r: per-SM CTA rounds (multiplies a_c)
    x_b: float  # W * r * k_iters: per-SM K-loop iterations (multiplies b_c)
    red_s: float  # partial-sum fixup seconds (split-K / Stream-K), structural, not fitted
    floor_s: float  # bytes / BW
    launches: int = 1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def ctas_per_sm(cfg: Config, profile: ArchProfile, operand_bytes: int = 2) -> int:
    """CTAs of `cfg` resident on one SM. A 3.x warp-specialized kernel with the automatic carve-out takes the
    SM's shared memory (1); otherwise what the stages' shared memory and the thread count allow."""
    if cfg.generation == "3x" and not cfg.stages:
        return 1
    tm, tn, tk = cfg.tile
    need = (tm * tk + tn * tk) * operand_bytes * (cfg.stages or 2)
    by_smem = profile.smem_per_sm_bytes // max(need, 1)
    wc = cfg.warp_count
    threads = 32 * wc[0] * wc[1] * wc[2] + (128 if cfg.generation == "3x" else 0)  # + the producer warpgroup
    return max(1, min(by_smem, 2048 // threads, 8))


def structure(cfg: Config, m: int, n: int, k: int, dtype: str, profile: ArchProfile) -> Structure | None:
    """The waves / residency / K-loop structure of `cfg` on (M, N, K); None when infeasible (rule 1)."""
    if min(m, n, k) <= 0:
        raise ValueError(f"GEMM dims must be positive, got M={m} N={n} K={k}")
    if cfg.swap_ab:  # the kernel computes D^T = W . A^T: its rows are the GEMM's N, its columns the tokens
        m, n = n, m
    eb = OPERAND_BYTES[normalize_dtype(dtype)]
    tm, tn, tk = cfg.tile
    cm, cn = cfg.cluster[0], cfg.cluster[1]
    tiles = (_cdiv(_cdiv(m, tm), cm) * cm) * (_cdiv(_cdiv(n, tn), cn) * cn)
    k_tiles = _cdiv(k, tk)
    csize = cm * cn
    sms = max(csize, (profile.sm_count // csize) * csize)
    cps = ctas_per_sm(cfg, profile, eb)
    slots = sms * cps
    feed = profile.l2_bw / profile.sm_count  # bytes/s one SM streams
    floor = ((m * k + n * k) * eb + m * n * OUT_BYTES) / profile.dram_bw_bytes_s
    tile_acc = tm * tn * ACC_BYTES

    if cfg.kernel_schedule == "streamk":
        full, rem = divmod(tiles, slots)
        sk_tiles = rem + (slots if full and rem else 0)  # the last full wave joins the SK part
        dp_waves = full - (1 if full and rem else 0)
        units = min(slots, (sk_tiles * k_tiles) // MIN_ITERS_PER_SK_UNIT)
        if sk_tiles == 0 or units <= sk_tiles or k_tiles == 1:
            split = 1  # data-parallel: the heuristic finds nothing to balance
        else:
            split = min(k_tiles, _cdiv(units, sk_tiles))
            per_sm = _cdiv(sk_tiles * k_tiles, units)
            red = SK_SYNC_S + (split + 1) * tile_acc / feed  # writers' partials + the finisher reading them
            x_a = dp_waves * cps + (2 if split > 1 else 1)  # an SK unit may touch two tiles
            x_b = dp_waves * cps * k_tiles + per_sm
            waves = dp_waves + 1
            return Structure(tiles, split, per_sm, waves, x_a / waves, x_a, x_b, red, floor)
    else:
        split = cfg.split_k
        if split > k_tiles:
            return None  # rule 1
    k_iters = _cdiv(k_tiles, split)
    ctas = tiles * split
    full, rem = divmod(ctas, slots)
    waves = full + (1 if rem else 0)
    x_a = full * cps + _cdiv(rem, sms)  # rule 2: the partial wave's CTAs do not share an SM
    red = 0.0
    if split > 1:  # serial split-K: each slice after the first reads and adds the running sum
        red = SK_SYNC_S + split * m * n * ACC_BYTES / profile.dram_bw_bytes_s
    return Structure(tiles, split, k_iters, waves, x_a / waves, x_a, x_a * k_iters, red, floor)


def _slots(cfg: Config, profile: ArchProfile, operand_bytes: int) -> int:
    csize = cfg.cluster[0] * cfg.cluster[1]
    return max(csize, (profile.sm_count // csize) * csize) * ctas_per_sm(cfg, profile, operand_bytes)


def probe_ms(cfg: Config, lo: int, hi: int, n: int, dtype: str, profile: ArchProfile, max_waves: int = 32) -> list[int]:
    """The Ms in (lo, hi] where `cfg` is at its worst against a smooth competitor: lo + 1, hi, and the first M
    past each wave edge (one more tile row starts a nearly empty wave) up to `max_waves` waves — beyond that a
    partial wave costs < 1/max_waves of the time. Checking a rung or region at these Ms checks all of it."""
    out = {lo + 1, hi}
    tm, tn, _ = cfg.tile
    cm, cn = cfg.cluster[0], cfg.cluster[1]
    if cfg.swap_ab:  # M runs along the tile's N (see `structure`)
        tm, tn, cm, cn = tn, tm, cn, cm
    col_tiles = _cdiv(_cdiv(n, tn), cn) * cn
    slots = _slots(cfg, profile, OPERAND_BYTES[normalize_dtype(dtype)])
    for wave in range(1, max_waves + 1):
        rows = _cdiv(wave * slots + 1, col_tiles)  # the first tile-row count with CTAs in wave + 1
        rows = _cdiv(rows, cm) * cm
        m = (rows - cm) * tm + 1  # the smallest M launching that many rows
        if m > hi:
            break
        if m > lo:
            out.add(m)
    return sorted(out)


def default_coefficients(cfg: Config, dtype: str, profile: ArchProfile) -> tuple[float, float, float]:
    """Uncalibrated (a_c, b_c, R_c) in seconds, from the profile's peak and L2 feed (see module doc)."""
    d = normalize_dtype(dtype)
    eb = OPERAND_BYTES[d]
    tm, tn, tk = cfg.tile
    peak_sm = profile.peak(d) / profile.sm_count
    feed = profile.l2_bw / profile.sm_count
    # Cluster multicast is not credited: on the H200 log a 2x1 cluster fed no faster than 1x1 (modelled so, the
    # 2x1 configs came out 20-35 % optimistic).
    kbytes = (tm + tn) * tk * eb
    b = max(2.0 * tm * tn * tk / peak_sm, kbytes / feed)
    a = PER_TILE_OVERHEAD_S + tm * tn * OUT_BYTES / feed
    return a, b, 0.0


# ---------------------------------------------------------------------------------------------- calibration

@dataclass(frozen=True)
class TorchCurve:
    """cuBLAS efficiency vs the profile's peak: a logistic in log2 M and log2(N*K) (see module doc)."""

    c0: float
    c1: float
    c2: float
    overhead_s: float = 0.0
    e_max: float = 1.0  # the efficiency cuBLAS saturates at (fraction of the profile's peak)
    bw_eff: float = 1.0  # the fraction of DRAM bandwidth cuBLAS reaches where it is memory-bound (small M)

    def eff(self, m: int, n: int, k: int) -> float:
        z = self.c0 + self.c1 * math.log2(max(m, 1)) + self.c2 * math.log2(max(n * k, 1))
        return self.e_max / (1.0 + math.exp(-max(min(z, 50.0), -50.0)))

    def to_dict(self) -> dict[str, float]:
        return {"c0": self.c0, "c1": self.c1, "c2": self.c2, "overhead_s": self.overhead_s, "e_max": self.e_max,
                "bw_eff": self.bw_eff}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "TorchCurve":
        c = TorchCurve(float(d["c0"]), float(d["c1"]), float(d["c2"]), float(d.get("overhead_s", 0.0)),
                       float(d.get("e_max", 1.0)), float(d.get("bw_eff", 1.0)))
        if not (0.0 < c.bw_eff <= 1.5 and 0.0 < c.e_max <= 1.5 and c.c1 >= 0 and c.c2 >= 0 and c.overhead_s >= 0):
            raise ValueError(f"torch curve out of range: {d!r}")
        return c


@dataclass
class Calibration:
    """Fitted model parameters for one (arch family, dtype): per-config (a, b, R) seconds and the torch curve.
    A config without coefficients here is modelled with `default_coefficients` (and so is every config when
    `configs` is empty: the structure ranks, the fitted curve prices cuBLAS)."""

    arch_family: str
    dtype: str = "fp16"
    configs: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    torch: TorchCurve | None = None
    # (alpha, beta, R): one scale for every config's structural a_c and b_c plus a common R, fitted over all
    # configs at once: what transfers to widths the fit never saw (used for configs not in `configs`)
    structure: tuple[float, float, float] | None = None
    sku: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


MODEL_KIND = "oasr.cost_model"
MODEL_VERSION = 1


def to_json(cal: Calibration) -> dict[str, Any]:
    """The `model` section of a tuning file (database.publish(..., model=...))."""
    return {"kind": MODEL_KIND, "version": MODEL_VERSION, "arch_family": cal.arch_family, "dtype": cal.dtype,
            "sku": cal.sku, "configs": {c: [float(x) for x in v] for c, v in sorted(cal.configs.items())},
            "torch": cal.torch.to_dict() if cal.torch else None,
            "structure": [float(x) for x in cal.structure] if cal.structure else None, "meta": dict(cal.meta)}


def from_json(d: Any) -> Calibration:
    """Inverse of `to_json`. ValueError naming the problem for anything else (a tuning file's `model` section
    is DB content: the runtime warns and models uncalibrated instead of failing a GEMM)."""
    if not isinstance(d, dict) or d.get("kind") != MODEL_KIND:
        raise ValueError(f"not an {MODEL_KIND} section: {str(d)[:120]!r}")
    if d.get("version") != MODEL_VERSION:
        raise ValueError(f"cost model version {d.get('version')!r} not supported (expected {MODEL_VERSION})")
    try:
        configs: dict[str, tuple[float, float, float]] = {}
        for cid, v in dict(d.get("configs") or {}).items():
            parse(cid)
            a, b, r = (float(x) for x in v)
            if not all(math.isfinite(x) and x >= 0 for x in (a, b, r)):
                raise ValueError(f"coefficients of {cid} must be finite and >= 0, got {v!r}")
            configs[cid] = (a, b, r)
        torch_d = d.get("torch")
        sd = d.get("structure")
        structure = None
        if sd is not None:
            structure = tuple(float(x) for x in sd)
            if len(structure) != 3 or not all(math.isfinite(x) and x >= 0 for x in structure):
                raise ValueError(f"structure scale must be three finite numbers >= 0, got {sd!r}")
        return Calibration(arch_family=str(d["arch_family"]), dtype=normalize_dtype(d.get("dtype", "fp16")),
                           configs=configs, torch=TorchCurve.from_dict(torch_d) if torch_d else None,
                           structure=structure,  # type: ignore[arg-type]
                           sku=str(d.get("sku", "")), meta=dict(d.get("meta") or {}))
    except (KeyError, TypeError, ConfigError) as e:
        raise ValueError(f"malformed cost model section: {e}") from None


# ---------------------------------------------------------------------------------------------- prediction

def coefficients(cfg: Config, dtype: str, profile: ArchProfile,
                 calibration: Calibration | None = None) -> tuple[float, float, float]:
    """(a_c, b_c, R_c) seconds: the config's fitted ones, else the structure scaled by the calibration's
    global scale, else the uncalibrated structure."""
    if calibration is not None:
        own = calibration.configs.get(cfg.id)
        if own is not None:
            return own
    a, b, r = default_coefficients(cfg, dtype, profile)
    if calibration is not None and calibration.structure is not None:
        al, be, r0 = calibration.structure
        return al * a, be * b, r0
    return a, b, r


def _as_config(config: Config | str) -> Config:
    return config if isinstance(config, Config) else parse(config)


def predict_torch_s(m: int, n: int, k: int, dtype: str, profile: ArchProfile, calibration: Calibration | None = None,
                    *, activation: bool = False) -> float:
    d = normalize_dtype(dtype)
    eb = OPERAND_BYTES[d]
    curve = (calibration.torch if calibration is not None and calibration.torch is not None
             else TorchCurve.from_dict(DEFAULT_TORCH_CURVE))
    flops = 2.0 * m * n * k
    floor = ((m * k + n * k) * eb + m * n * OUT_BYTES) / (profile.dram_bw_bytes_s * curve.bw_eff)
    t = max(flops / (profile.peak(d) * curve.eff(m, n, k)), floor) + curve.overhead_s + profile.graph_launch_s
    if activation:  # the eager activation after cuBLAS: one more kernel reading and writing M x N
        t += profile.graph_launch_s + 2.0 * m * n * OUT_BYTES / profile.dram_bw_bytes_s
    return t


def predict_s(config: Config | str, m: int, n: int, k: int, dtype: str, profile: ArchProfile,
              calibration: Calibration | None = None, *, activation: bool = False) -> float:
    """Predicted seconds; inf for an infeasible config. `config`: a Config, an id, or "torch"/"fused"."""
    if isinstance(config, str) and config in TORCH_ARMS:
        return predict_torch_s(m, n, k, dtype, profile, calibration, activation=activation and config == "torch")
    cfg = _as_config(config)
    st = structure(cfg, m, n, k, dtype, profile)
    if st is None:
        return math.inf
    a, b, r = coefficients(cfg, dtype, profile, calibration)
    body = st.x_a * a + st.x_b * b + r + st.red_s
    return max(body, st.floor_s) + st.launches * profile.graph_launch_s


def predict_us(config: Config | str, m: int, n: int, k: int, dtype: str, profile: ArchProfile,
               calibration: Calibration | None = None, *, activation: bool = False) -> float:
    return predict_s(config, m, n, k, dtype, profile, calibration, activation=activation) * 1e6


def rank(candidate_ids: Iterable[str], m: int, n: int, k: int, dtype: str, profile: ArchProfile,
         calibration: Calibration | None = None, *, activation: bool = False) -> list[tuple[str, float]]:
    """[(id, predicted us)] fastest first; infeasible configs are left out; ties keep the candidates' order."""
    out = []
    for cid in dict.fromkeys(candidate_ids):
        t = predict_us(cid, m, n, k, dtype, profile, calibration, activation=activation)
        if math.isfinite(t):
            out.append((cid, t))
    return sorted(out, key=lambda x: x[1])


def choose(candidate_ids: Iterable[str], m: int, n: int, k: int, dtype: str, profile: ArchProfile,
           calibration: Calibration | None = None, gate: float = 0.02, *, activation: bool = False) -> str:
    """The modelled choice: the best CUTLASS candidate where it beats torch by more than `gate`
    (T_torch > (1 + gate) * T_best), else "torch"."""
    cands = [c for c in candidate_ids if c not in TORCH_ARMS]
    ranked = rank(cands, m, n, k, dtype, profile, calibration, activation=activation)
    if not ranked:
        return "torch"
    t_torch = predict_us("torch", m, n, k, dtype, profile, calibration, activation=activation)
    best, t_best = ranked[0]
    return best if t_torch > (1.0 + gate) * t_best else "torch"

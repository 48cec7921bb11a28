"""The benchmark protocol shared by `oasr tune build`, `prewarm`, `autotune()` and benchmarks/.

- Refuses to run inside a CUDA-graph capture (`BenchError`).
- Each arm is a CUDA graph of N >= 8 calls; every call is followed by a tiny unrelated kernel (so back-to-back
  copies of one kernel cannot overlap through programmatic dependent launch, as they cannot inside a model),
  and that kernel's separately measured cost is subtracted. Each replay is timed on its own (events around a
  single replay): replays never overlap each other.
- Weights rotate through enough copies to be cold when the served model's weight working set exceeds L2 and
  stay warm when it does not: the caller says which (`cold=True`) and `copies_for()` sizes the rotation.
- Arms are interleaved in rounds, shuffled (the build) or alternating forward / reverse (`order="alternate"`, the
  benchmarks: with two arms every arm is first in half the rounds); the estimator is the median and
  sigma = 1.4826 x MAD (stats.py).
- `separator=False` drops the separator (back-to-back calls of one kernel, the anchors' protocol: what cuBLAS's
  programmatic dependent launch can overlap, and a model cannot; benchmarks/scaled_mm_fp8_protocol.py).
- SM clock and other compute processes are recorded per measurement (once per round, then one untimed replay so
  the host's sampling gap does not land on the round's first timing); a run with other processes is marked
  contended.
- Ops that cannot be captured are timed eagerly (`eager=True`).
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .stats import Estimate, estimate

MIN_CALLS = 8
L2_BYTES_DEFAULT = 60 * 1024 * 1024  # H200; `l2_bytes()` asks the device


class BenchError(RuntimeError):
    pass


def refuse_in_capture() -> None:
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise BenchError("oasr bench: refusing to measure inside a CUDA-graph capture")


def l2_bytes() -> int:
    try:
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size)
    except (AttributeError, RuntimeError):
        return L2_BYTES_DEFAULT


def copies_for(bytes_per_copy: int, cold: bool, cap: int = 1024) -> int:
    """How many weight copies one rotation needs: enough to exceed 2x L2 when cold, one when warm."""
    if not cold:
        return 1
    return max(1, min(cap, math.ceil(2 * l2_bytes() / max(bytes_per_copy, 1))))


def weights_cold(model_weight_bytes: int) -> bool:
    """Whether a signature's weights are timed cold: when the served model's weight working set exceeds L2, or
    is unknown (the build's rule; the fp8 census benchmark applies it too, so both time the same state)."""
    return model_weight_bytes > l2_bytes() if model_weight_bytes else True


@dataclass
class Environment:
    sm_clock_mhz: list[int] = field(default_factory=list)
    other_processes: int = 0

    @property
    def contended(self) -> bool:
        return self.other_processes > 0

    def sample(self) -> None:
        try:
            self.sm_clock_mhz.append(int(torch.cuda.clock_rate()))
        except Exception:  # pynvml missing or unsupported: the record just lacks clocks
            pass
        try:
            import os

            procs = torch.cuda.list_gpu_processes()
            mine = str(os.getpid())
            self.other_processes = max(self.other_processes,
                                       sum(1 for ln in procs.splitlines() if "process" in ln and mine not in ln))
        except Exception:
            pass

    def as_dict(self) -> dict:
        c = self.sm_clock_mhz
        return {"sm_clock_mhz": [min(c), max(c)] if c else None, "other_processes": self.other_processes,
                "contended": self.contended}


@dataclass
class ArmResult:
    estimate: Estimate
    samples_s: list[float]


def _separator() -> Callable[[], None]:
    tiny = torch.zeros(1, device="cuda")

    def sep() -> None:
        tiny.add_(1.0)
    return sep


def _capture(calls: list[Callable[[], object]], sep: Callable[[], None] | None) -> torch.cuda.CUDAGraph:
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls[:2]:  # warm-up outside the graph: plans, lazy loading, workspace
            c()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            for c in calls:
                c()
                if sep is not None:
                    sep()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    return g


def _time_replay(g: torch.cuda.CUDAGraph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3


def _time_eager(calls: list[Callable[[], object]]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for c in calls:
        c()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3


ORDERS = ("shuffle", "alternate")


def round_order(keys: list, i: int, rng: random.Random, order: str = "shuffle") -> list:
    """The order round `i` times `keys` in: shuffled by `rng`, or `keys` forward in even rounds and reversed in
    odd ones ("alternate")."""
    if order == "alternate":
        return list(keys) if i % 2 == 0 else list(keys)[::-1]
    if order != "shuffle":
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    out = list(keys)
    rng.shuffle(out)
    return out


def warm_key(ordered: list, replayable: Callable[[Any], bool]) -> Any | None:
    """The key a round replays once, untimed, before timing `ordered`: the first replayable one. Sampling the
    environment leaves the GPU idle for a moment and the first timing after it ran ~1 % slower at 4 us shapes on
    the H200 (6 % in the first round) — in alternating order always the same arm (docs/perf/scaled_mm_fp8.md)."""
    return next((k for k in ordered if replayable(k)), None)


def measure(arms: dict[str, list[Callable[[], object]]], *, rounds: int = 7, seed: int = 0,
            eager: frozenset[str] = frozenset(), env: Environment | None = None, order: str = "shuffle",
            separator: bool = True) -> dict[str, ArmResult]:
    """Per-call GPU seconds of each arm. `arms[name]` is the list of N >= 8 calls one replay makes (call i
    bound to weight copy i % copies). Arms named in `eager` are timed as eager loops (not capturable).
    `order`: how each round orders the arms (`round_order`); `separator=False`: no separator kernel between
    calls (module doc).

    Raises BenchError inside a capture or for an arm with fewer than MIN_CALLS calls; ValueError for an
    unknown `order`.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    refuse_in_capture()
    for name, calls in arms.items():
        if len(calls) < MIN_CALLS:
            raise BenchError(f"arm {name}: {len(calls)} calls per replay, need >= {MIN_CALLS}")
    env = env if env is not None else Environment()
    sep = _separator() if separator else None
    n_by_len: dict[int, torch.cuda.CUDAGraph] = {}
    graphs: dict[str, torch.cuda.CUDAGraph | None] = {}
    for name, calls in arms.items():
        graphs[name] = None if name in eager else _capture(calls, sep)
        if sep is not None and len(calls) not in n_by_len:
            n_by_len[len(calls)] = _capture([lambda: None] * len(calls), sep)  # separators alone
    for g in list(graphs.values()) + list(n_by_len.values()):  # first replay: not timed
        if g is not None:
            g.replay()
    torch.cuda.synchronize()
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {n: [] for n in arms}
    sep_samples: dict[int, list[float]] = {n: [] for n in n_by_len}
    replayable = {("sep", n) for n in n_by_len} | {("arm", n) for n, g in graphs.items() if g is not None}
    for i in range(rounds):
        env.sample()
        keys = [("arm", n) for n in arms] + [("sep", n) for n in n_by_len]
        ordered = round_order(keys, i, rng, order)
        first = warm_key(ordered, replayable.__contains__)
        if first is not None:
            (n_by_len[first[1]] if first[0] == "sep" else graphs[first[1]]).replay()
        for kind, key in ordered:
            if kind == "sep":
                sep_samples[key].append(_time_replay(n_by_len[key]))
            elif graphs[key] is None:
                samples[key].append(_time_eager(arms[key]))
            else:
                samples[key].append(_time_replay(graphs[key]))
    out: dict[str, ArmResult] = {}
    for name, calls in arms.items():
        n = len(calls)
        sep_cost = estimate(sep_samples[n]).median_s if name not in eager and sep is not None else 0.0
        per_call = [max(t - sep_cost, 0.0) / n for t in samples[name]]
        out[name] = ArmResult(estimate(per_call), per_call)
    del graphs, n_by_len
    return out


def host_overhead_us(fn: Callable[[], object], iters: int = 2000) -> float:
    """Eager per-call host cost: wall time of a loop of launches that the GPU keeps up with, in µs."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / iters * 1e6

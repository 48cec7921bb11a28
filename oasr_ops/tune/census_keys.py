"""The census's graph keys and their traffic (spec "The census"; `oasr_ops.tune.census` has the rules): batch and
time buckets, the manifest replay of offline traffic, the streaming concurrency histogram, and the key limit.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

DEFAULT_TIME_GRANULARITY = 64
DEFAULT_MAX_KEYS = 1024
DEFAULT_STEPS = 1000
DEFAULT_MAX_SECONDS = 30.0


@dataclass(frozen=True)
class Key:
    batch: int
    frames: int
    traffic: float = 0.0  # batches (offline) or expected steps (streaming) using this key


def batch_buckets(max_batch_size: int) -> list[int]:
    if max_batch_size < 1:
        raise ValueError("max_batch_size must be >= 1")
    out, b = [], 1
    while b < max_batch_size:
        out.append(b)
        b *= 2
    out.append(max_batch_size)
    return out


def _round_up(x: int, step: int) -> int:
    return -(-x // step) * step


def read_manifest(path: str | Path) -> list[float]:
    """Durations (seconds) from JSON lines with a ``duration`` field; blank lines skipped. ValueError naming the
    line for one that is not JSON or has no positive, finite duration (NaN passed ``d <= 0`` and became NaN
    frames; infinity an OverflowError)."""
    from ..errors import json_lines

    out = []
    for i, rec in json_lines(path):
        d = rec.get("duration") if isinstance(rec, dict) else None
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not (0 < d < math.inf):
            raise ValueError(f"{path}:{i}: no positive 'duration' (a finite number of seconds), got "
                             f"{json.dumps(d)[:40]}")
        out.append(float(d))
    return out


def offline_keys(durations: Sequence[float], max_batch_size: int, *, frame_shift_ms: float = 10.0,
                 time_granularity: int = DEFAULT_TIME_GRANULARITY, fixed_window: int | None = None,
                 max_frames: int | None = None) -> list[Key]:
    """Every (batch bucket, time bucket) key, each with the number of replayed batches it serves."""
    bb = batch_buckets(max_batch_size)
    frames = [max(1, round(d * 1000.0 / frame_shift_ms)) for d in durations]
    if fixed_window:
        tb = [int(fixed_window)]

        def t_bucket(t: int) -> int:
            return int(fixed_window)
    else:
        top = max_frames or (max(frames) if frames else round(DEFAULT_MAX_SECONDS * 1000 / frame_shift_ms))
        tb = list(range(time_granularity, _round_up(top, time_granularity) + 1, time_granularity))

        def t_bucket(t: int) -> int:
            return _round_up(min(t, tb[-1]), time_granularity)
    traffic: dict[tuple[int, int], int] = {}
    order = sorted(frames, reverse=True)
    for i in range(0, len(order), max_batch_size):
        batch = order[i:i + max_batch_size]
        b = next(x for x in bb if x >= len(batch))
        key = (b, t_bucket(batch[0]))
        traffic[key] = traffic.get(key, 0) + 1
    return [Key(b, t, float(traffic.get((b, t), 0))) for b in bb for t in tb]


def default_concurrency(max_batch_size: int, mean: float | None = None) -> dict[int, float]:
    """Poisson(mean, default max/4) over 1..max, renormalised (see the module docstring)."""
    lam = float(mean) if mean else max(1.0, max_batch_size / 4.0)
    logp = {w: w * math.log(lam) - lam - math.lgamma(w + 1) for w in range(1, max_batch_size + 1)}
    top = max(logp.values())
    p = {w: math.exp(v - top) for w, v in logp.items()}
    s = sum(p.values())
    return {w: v / s for w, v in p.items()}


def chunk_input_frames(chunk_size: int, subsampling: int) -> int:
    return chunk_size * subsampling + max(subsampling - 1, 0)


def streaming_keys(max_batch_size: int, frames: int, histogram: dict[int, float] | None = None,
                   steps: int = DEFAULT_STEPS) -> list[Key]:
    hist = histogram or default_concurrency(max_batch_size)
    total = sum(v for w, v in hist.items() if 1 <= int(w) <= max_batch_size) or 1.0
    return [Key(w, frames, steps * float(hist.get(w, hist.get(str(w), 0.0))) / total)
            for w in range(1, max_batch_size + 1)]


def limit_keys(keys: list[Key], max_keys: int | None) -> list[Key]:
    if not max_keys or len(keys) <= max_keys:
        return keys
    hot = sorted((k for k in keys if k.traffic > 0), key=lambda k: -k.traffic)[:max_keys]
    cold = [k for k in keys if k.traffic <= 0]
    room = max_keys - len(hot)
    if room > 0 and cold:
        step = len(cold) / room
        hot += [cold[int(i * step)] for i in range(min(room, len(cold)))]
    chosen = set(hot)
    return [k for k in keys if k in chosen]

"""The result cache of `oasr_ops.autotune()`: measured winners by signature, bucket and measured M; its file.

Lookup (spec, "oasr.autotune()"): a dynamic M is keyed by its bucket (`tune.shapes.bucket_of`: step 8 up to 128,
x sqrt(2) up to 1024, x2 above); inside the bucket the result measured at the closest M at or above the call
answers. A result serves only Ms at or below the one it was measured at, so a larger M in the same bucket is a
miss (measured under ``autotune(True)``, the fallback otherwise). Other buckets never answer.

The file (JSON; one per user choice, e.g. ``oasr_tune.json``)::

    {"version": 3, "arch": "sm90", "env": {"sku": ..., "torch": ..., "cuda": ..., "nvcc": ..., "cutlass": ...},
     "results": {"gemm|op=gemm|dt=fp16|N=512|K=256": {"104": [{"m": 100, "config": "b64x...", "us": 5.1,
                                                                "candidates": 20}]}}}

* version 3: each result keeps the M it was measured at; a result without ``m`` serves its whole bucket (what
  a version-2 entry meant, kept through a rewrite).
* version 2: ``{"<bucket>": {"config": ...}}`` (or a list of such): no shape; serves the whole bucket.
* version 1: ``{"<M>": "<config>"}`` (or ``{"config": ...}``): exact shapes; each becomes a result measured at M.

Signatures carry the call's own dtype (``dt=fp16`` / ``dt=bf16``: a result is measured in one dtype). ``arch`` is
a hard validator: a file tuned on another arch is not loaded (one warning). ``env`` is soft: differences warn
once and the results are served (they can only be slower than a fresh tune: every config is still checked for
feasibility when its plan is made). A malformed result is skipped (one warning per file).

Writes (`flush`) take the file's lock (filelock), re-read it, merge only this process's new results (an entry
another process wrote meanwhile survives; at an equal (signature, bucket, M) this process's result wins) and
replace the file atomically (tempfile + fsync + os.replace), like the tuning DB's writer. Nothing here imports
torch.
"""
from __future__ import annotations

import json
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .. import paths
from ..configs import SENTINELS, ConfigError, parse
from ..runtime.database import parse_signature
from ..runtime.db_files import read_document
from .shapes import bucket_of

VERSION = 3
LOCK_TIMEOUT_S = 60.0


class AutotuneWarning(UserWarning):
    pass


@dataclass(frozen=True)
class Result:
    """One measured winner. ``m`` None: a version-2 result, serving its whole bucket."""

    m: int | None
    config: str
    us: float | None = None
    candidates: int = 0

    def serves_up_to(self, bucket: int) -> int:
        return bucket if self.m is None else self.m

    def as_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"config": self.config}
        if self.m is not None:
            d = {"m": self.m, **d}
        if self.us is not None:
            d["us"] = round(self.us, 4)
        if self.candidates:
            d["candidates"] = self.candidates
        return d


Key = tuple[str, int]  # (signature, bucket)


def _valid_config(cfg: Any) -> bool:
    if not isinstance(cfg, str):
        return False
    if cfg in SENTINELS:
        return True
    try:
        parse(cfg)
    except ConfigError:
        return False
    return True


def _result(raw: Any, m: int | None) -> Result | None:
    if isinstance(raw, str):
        raw = {"config": raw}
    if not isinstance(raw, dict) or not _valid_config(raw.get("config")):
        return None
    us = raw.get("us")
    cands = raw.get("candidates", 0)
    return Result(m, raw["config"], float(us) if isinstance(us, (int, float)) else None,
                  int(cands) if isinstance(cands, int) else 0)


def _pos_int(s: Any) -> int | None:
    try:
        v = int(s)
    except (TypeError, ValueError):
        return None
    return v if v > 0 and str(v) == str(s).strip() else None


def parse_results(doc: Mapping[str, Any]) -> tuple[dict[Key, list[Result]], int]:
    """The results of a cache document of any version, and how many malformed ones were skipped."""
    version = doc.get("version")
    raw = doc.get("results")
    out: dict[Key, list[Result]] = {}
    bad = 0
    if not isinstance(raw, dict):
        return out, 1
    for sig, by_key in raw.items():
        if parse_signature(sig) is None or not isinstance(by_key, dict):
            bad += 1
            continue
        for key, val in by_key.items():
            n = _pos_int(key)
            if n is None:
                bad += 1
                continue
            items: list[tuple[Any, int | None]]
            if version == 1:  # exact shapes: key is the measured M
                items = [(val, n)]
                n = bucket_of(n)
            else:  # key is a bucket; v3 results say their M, v2 ones do not
                if n != bucket_of(n):
                    bad += 1
                    continue
                vals = val if isinstance(val, list) else [val]
                items = []
                for v in vals:
                    m = v.get("m") if (version == 3 and isinstance(v, dict)) else None
                    if m is not None and (type(m) is not int or m <= 0 or bucket_of(m) != n):
                        bad += 1
                        continue
                    items.append((v, m))
            for v, m in items:
                r = _result(v, m)
                if r is None:
                    bad += 1
                else:
                    _insert(out.setdefault((sig, n), []), r)
    return out, bad


def _insert(lst: list[Result], r: Result) -> None:
    """Keep `lst` sorted by the M a result serves up to; a result at the same M replaces the old one."""
    lst[:] = [x for x in lst if x.m != r.m] + [r]
    lst.sort(key=lambda x: (x.m is None, x.m or 0))


def current_env() -> dict[str, Any]:
    """This process's soft validators for a cache file."""
    from ..runtime import validators

    env: dict[str, Any] = {"sku": validators._sku(), "nvcc": validators.nvcc_version(),
                           "cutlass": validators.cutlass_version()}
    try:
        import torch

        env.update(torch=torch.__version__, cuda=torch.version.cuda)
    except ImportError:  # pragma: no cover
        pass
    return env


def _hard_problem(doc: Any, arch: str) -> str | None:
    if not isinstance(doc, dict):
        return "not a JSON object"
    if doc.get("version") not in (1, 2, 3):
        return f"unknown version {doc.get('version')!r} (this oasr_ops reads 1, 2 and 3)"
    if doc.get("arch") != arch:
        return f"tuned on {doc.get('arch')!r}, this GPU is {arch}"
    return None


class ResultCache:
    """Measured winners of one arch, in memory; `load` / `flush` move them to and from a file."""

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self._results: dict[Key, list[Result]] = {}
        self._new: dict[Key, list[Result]] = {}  # measured by this process, not yet flushed
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return sum(len(v) for v in self._results.values())

    def lookup(self, sig: str, m: int) -> Result | None:
        """The result measured at the closest M at or above `m` in `m`'s bucket (None: a miss)."""
        b = bucket_of(m)
        for r in self._results.get((sig, b), ()):
            if r.serves_up_to(b) >= m:
                return r
        return None

    def add(self, sig: str, r: Result) -> None:
        if r.m is None:
            raise ValueError("a measured result needs the M it was measured at")
        key = (sig, bucket_of(r.m))
        with self._lock:
            _insert(self._results.setdefault(key, []), r)
            _insert(self._new.setdefault(key, []), r)

    def pending(self) -> int:
        return sum(len(v) for v in self._new.values())

    def load(self, path: str | os.PathLike) -> int:
        """Add the results of `path` (any version); returns how many. A missing file is an empty cache; a file
        of another arch or an unknown version is not loaded (one warning); environment differences warn."""
        path = Path(path)
        d = read_document(path)  # the tuning DB's reader: size-capped, never raises (a why instead)
        doc, why = d.doc, d.why
        if why == "absent":
            return 0
        why = why or _hard_problem(doc, self.arch)
        if why is not None:
            warnings.warn(f"oasr.autotune: cache {path} not loaded: {why}", AutotuneWarning, stacklevel=3)
            return 0
        env = doc.get("env") if isinstance(doc.get("env"), dict) else {}
        cur = current_env()
        diff = sorted(k for k, v in cur.items() if v is not None and env.get(k) != v)
        if diff:
            warnings.warn(f"oasr.autotune: cache {path} was tuned under another environment ("
                          + ", ".join(f"{k}: {env.get(k)!r} -> {cur[k]!r}" for k in diff)
                          + "); its results are served, re-tune with a fresh cache for the best ones",
                          AutotuneWarning, stacklevel=3)
        results, bad = parse_results(doc)
        if bad:
            warnings.warn(f"oasr.autotune: cache {path}: {bad} malformed result(s) skipped", AutotuneWarning,
                          stacklevel=3)
        with self._lock:
            for key, lst in results.items():
                mine = self._results.setdefault(key, [])
                for r in lst:
                    if not any(x.m == r.m for x in mine):  # what this process measured wins
                        _insert(mine, r)
        return sum(len(v) for v in results.values())

    def flush(self, path: str | os.PathLike, lock_timeout: float = LOCK_TIMEOUT_S) -> int:
        """Merge this process's new results into `path` under its lock, atomically; returns how many were
        written. A file of another arch is left alone (one warning, nothing written)."""
        from filelock import FileLock, Timeout

        with self._lock:
            new = {k: list(v) for k, v in self._new.items()}
        if not new:
            return 0
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path) + ".lock", timeout=lock_timeout)
        try:
            lock.acquire()
        except Timeout:
            raise TimeoutError(f"oasr.autotune: could not lock {path} within {lock_timeout}s") from None
        try:
            d = read_document(path)
            doc, why, mode = d.doc, d.why, d.mode
            merged: dict[Key, list[Result]] = {}
            if why is None:
                problem = _hard_problem(doc, self.arch)
                if problem is not None and isinstance(doc, dict) and (
                        doc.get("arch") not in (None, self.arch) or doc.get("version") not in (None, 1, 2, 3)):
                    # another arch's cache, or a newer oasr_ops's: someone's valid data, never overwritten
                    warnings.warn(f"oasr.autotune: cache {path} is another arch's or a newer oasr_ops's ({problem}); "
                                  "not overwritten, results not saved", AutotuneWarning, stacklevel=3)
                    return 0
                if problem is None:
                    merged, _bad = parse_results(doc)
                else:
                    why = problem
            if why not in (None, "absent"):  # unreadable: kept aside, never overwritten
                paths.move_aside(path, why, "oasr.autotune: cache", AutotuneWarning)
                mode = None
            for key, lst in new.items():
                for r in lst:
                    _insert(merged.setdefault(key, []), r)
            out: dict[str, dict[str, list]] = {}
            for (sig, b), lst in sorted(merged.items()):
                out.setdefault(sig, {})[str(b)] = [r.as_json() for r in lst]
            paths.write_text_atomic(path, json.dumps({"version": VERSION, "arch": self.arch, "env": current_env(),
                                                      "results": out}, indent=1), mode=mode)
        finally:
            lock.release()
        with self._lock:
            for key, lst in new.items():  # forget what was written (a result measured meanwhile stays new)
                left = [r for r in self._new.get(key, []) if r not in lst]
                if left:
                    self._new[key] = left
                else:
                    self._new.pop(key, None)
        return sum(len(v) for v in new.values())

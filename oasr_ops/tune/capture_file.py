"""The ``OASR_CAPTURE_GEMM`` recording's file format (JSON lines, one record per (signature, dtype, M) with a call
count), read by ``oasr tune census --capture`` and written by the recorder (`oasr_ops.inductor.capture`)::

    {"signature": "gemm|op=gemm|dt=half|N=1024|K=256", "dtype": "bf16", "m": 250, "calls": 32}
"""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any


def read_capture(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a capture file (JSON lines) that `capture_problem` accepts; any other line (torn, not
    UTF-8, too deep, a bad field) is skipped: the recorder's merge reads through this and must never fail."""
    out = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            r = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if capture_problem(r) is None:
            out.append(r)
    return out


def capture_problem(r: Any) -> str | None:
    """Why a capture record cannot be merged into a census, or None: ``signature`` a tuning signature, ``m`` an
    integer > 0, ``calls`` (default 1) an integer >= 0, ``dtype`` (default half) a string."""
    from ..errors import is_int
    from ..runtime.database import parse_signature

    if not isinstance(r, dict):
        return "not a JSON object"
    if parse_signature(r.get("signature")) is None:
        return f"signature {json.dumps(r.get('signature'))[:80]} is not a tuning signature"
    if not (is_int(r.get("m")) and r["m"] > 0):
        return f"m must be an integer > 0, got {json.dumps(r.get('m'))[:40]}"
    if "calls" in r and not (is_int(r["calls"]) and r["calls"] >= 0):
        return f"calls must be an integer >= 0, got {json.dumps(r['calls'])[:40]}"
    if "dtype" in r and not isinstance(r["dtype"], str):
        return f"dtype must be a string, got {json.dumps(r['dtype'])[:40]}"
    return None


def check_capture(path: str | os.PathLike) -> int:
    """The number of records of the capture file at `path`, every line checked (`capture_problem`): ValueError
    naming the file and line. `oasr tune census --capture` runs this before tracing — `read_capture` skips what
    it cannot parse (the recorder's merge must never fail), and a record it keeps with a negative M or a
    fractional call count would make a census `oasr tune build` refuses after the trace."""
    from ..errors import json_lines

    n = 0
    for i, r in json_lines(path):
        why = capture_problem(r)
        if why is not None:
            raise ValueError(f"{path}:{i}: {why}")
        n += 1
    return n


def write_counts(path: str | os.PathLike, counts: Counter) -> None:
    """Merge `counts` into the capture file at `path` (lock, re-read, add, atomic replace keeping the file's mode;
    records it cannot read are dropped, see `read_capture`)."""
    from filelock import FileLock

    from ..paths import write_text_atomic

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(p) + ".lock"):
        merged: Counter = Counter()
        for r in read_capture(p):
            merged[(r["signature"], r.get("dtype", "half"), r["m"])] += int(r.get("calls", 1))
        merged.update(counts)
        mode = p.stat().st_mode & 0o777 if p.exists() else None
        write_text_atomic(p, "\n".join(json.dumps({"signature": sig, "dtype": dt, "m": m, "calls": c})
                                        for (sig, dt, m), c in sorted(merged.items())), mode)

"""`OASR_CAPTURE_GEMM=FILE`: record the shapes of eager `oasr.gemm` calls, for `oasr tune census --capture`.

The recorder is a `TorchDispatchMode` that `import oasr_ops` pushes onto the (thread-local) dispatch-mode stack
of the importing thread when the variable is set; unset, nothing is installed and nothing is paid per call.
It counts every `oasr.gemm` call on real (non-fake, non-meta) tensors by (signature, M), whatever issued it: an
eager model, a decode loop the census probes do not reach. The counts are merged into FILE at exit (and on
`flush()`), under the file's lock, as JSON lines::

    {"signature": "gemm|op=gemm|dt=half|N=1024|K=256", "dtype": "bf16", "m": 250, "calls": 32}

Limits (decision: keep it simple): only the importing thread is recorded; while the mode is active Dynamo
compiles nothing new on that thread (run the capture on an eager deployment); the aten GEMMs a model calls
directly are not recorded — only `oasr.gemm`.
"""
from __future__ import annotations

import atexit
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..runtime.plans import WarnOnce
from ..tune.capture_file import read_capture, write_counts  # noqa: F401  (the file format; re-exported)

ENV = "OASR_CAPTURE_GEMM"


def _key(args: tuple, kwargs: dict) -> tuple[str, str, int] | None:
    from ..runtime import database

    a, w = args[0], args[1]
    if not isinstance(a, torch.Tensor) or not isinstance(w, torch.Tensor):
        return None
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(a, FakeTensor) or a.device.type == "meta" or w.dim() != 2:
        return None
    act = args[3] if len(args) > 3 else kwargs.get("activation", "none")
    n, k = int(w.shape[0]), int(w.shape[1])
    m = a.numel() // k if k else 0
    op = "gemm" if act in ("none", None) else "gemm_activation"
    try:
        sig = database.signature("gemm", op, "half", n, k)
        dt = database.normalize_dtype(a.dtype)
    except ValueError:
        return None
    return sig, dt, m


class GemmRecorder(TorchDispatchMode):
    """Counts `oasr.gemm` calls by (signature, dtype, M). Usable as a context manager in tests and tools."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()
        self.configs: list[tuple[str, int, str]] = []  # (signature, M, config string) of every call
        self._lock = threading.Lock()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.oasr.gemm.default:
            key = _key(args, kwargs)
            if key is not None:
                cfg = args[4] if len(args) > 4 else kwargs.get("config", "auto")
                with self._lock:
                    self.counts[key] += 1
                    self.configs.append((key[0], key[2], cfg))
        return func(*args, **kwargs)


_installed: GemmRecorder | None = None
_path: Path | None = None
_WARN = WarnOnce()


def flush() -> None:
    """Write what the installed recorder counted so far into the capture file (and reset its counts)."""
    rec, path = _installed, _path
    if rec is None or path is None:
        return
    with rec._lock:
        counts, rec.counts = rec.counts, Counter()
        rec.configs.clear()
    if counts:
        try:
            write_counts(path, counts)
        except (OSError, TimeoutError) as e:  # an unwritable path: kept for the next flush, said once
            with rec._lock:
                rec.counts.update(counts)
            _WARN("write", f"{ENV}={path}: cannot write the capture ({e}); the counts are kept in memory and "
                  "written at the next flush", RuntimeWarning)


def install_from_env() -> GemmRecorder | None:
    """Push the recorder if OASR_CAPTURE_GEMM names a file (idempotent); flushes at interpreter exit."""
    global _installed, _path
    target = os.environ.get(ENV, "").strip()
    if not target or _installed is not None:
        return _installed
    _path = Path(target).expanduser()
    _installed = GemmRecorder()
    _installed.__enter__()
    atexit.register(flush)
    return _installed

"""The C++ hot path of `oasr::gemm` (templates/hot_path.cpp), opt-in: `enable()`, or ``OASR_CPP_HOT_PATH=1`` in the
environment of a process importing oasr_ops.

Why: without CUDA graphs a served model is host-bound, and each Python op call costs ~3x the aten call it
replaces (docs/architecture.md, "Without CUDA graphs the host decides"). The C++ path keeps every decision in
Python and replays them: the Python implementation (families/gemm/ops.py `_gemm_cuda`) makes a call key's plan as
before and, while the hot path is on, installs it in the C++ table (`install_gemm`); the next call of that key is
answered in C++ (the plan's torch arm, or its kernel launched through the launcher's C function pointer). A call
C++ cannot answer (no plan for its key yet, an operand that fails a check, a misaligned pointer) goes to the Python
implementation, registered for it as `oasr::_gemm_py`, so errors, warnings and fallbacks are exactly the Python
path's.

`enable(backend)` takes one backend key over: it removes the Python kernel of `oasr::gemm` at that key
(families/autograd.py keeps each backend kernel in a Library of its own for this), registers the Python
implementation as `oasr::_gemm_py` there, and lets the C++ library register `oasr::gemm` at the key and at its
Autograd key. `disable()` undoes it. The backend is CUDA; CPU exists for the CPU suite (stub kernel launchers).
Plans are forgotten with the Python ones (`reset_plans`, a DB reload); call counts are collected into the Python
plans when `served()` reads them.
"""
from __future__ import annotations

import ctypes
import os
import threading
import warnings
from typing import Any

import torch

from ..runtime import database as _database
from .autograd import BACKEND_KERNELS, register_backend_kernel, unregister_backend_kernel

ENV = "OASR_CPP_HOT_PATH"
ARM_TORCH, ARM_TORCH_FUSED_RELU, ARM_KERNEL = 0, 1, 2
ACTIVATION_CODES = {"none": 0, "relu": 1, "gelu": 2, "silu": 3}

_LOCK = threading.RLock()
_backend: str | None = None
_python_impl_lib: Any = None  # the Library registering oasr::_gemm_py at the backend key
_removed: dict[str, Any] = {}  # backend key -> the Python kernel of oasr::gemm that enable() unregistered
_slots: list = []  # slot -> the Python Plan whose calls the C++ table counts
_installed: set[tuple] = set()
installing = False  # read by the Python implementation on every call: install plans while the hot path is on


def native_torch(activation: str, fused_relu: bool = False) -> tuple[int, int, int, int, int]:
    """What a torch-arm plan tells the C++ table: (arm, launcher, split, activation code, workspace bytes)."""
    return (ARM_TORCH_FUSED_RELU if fused_relu else ARM_TORCH, 0, 0, ACTIVATION_CODES[activation], 0)


def native_kernel(cdll_function: Any, split: int, activation: str, workspace_bytes: int) -> tuple[int, ...]:
    """What a kernel plan tells the C++ table: the launcher's C function pointer (`oasr_run` of a gemm library)."""
    return (ARM_KERNEL, int(ctypes.cast(cdll_function, ctypes.c_void_p).value), int(split),
            ACTIVATION_CODES[activation], int(workspace_bytes))


def enabled() -> str | None:
    """The backend key the hot path serves ("CUDA", "CPU"), or None."""
    return _backend


def enable(backend: str = "CUDA") -> None:
    """Build (once, cached like the kernels) and load the C++ library, then serve `oasr::gemm` at `backend` from it.
    Raises BuildError / LoadError (codegen/host_ext.py) when it cannot, leaving the Python path in place. Switch it
    on before serving, not while other threads call the op: between the Python kernel's removal and the C++ one's
    registration (microseconds) a call of the op at that key finds no kernel."""
    global _backend, _python_impl_lib, installing
    from ..codegen.host_ext import HostExtension

    if backend not in ("CUDA", "CPU"):
        raise ValueError(f"oasr_ops hot path: backend must be 'CUDA' or 'CPU', got {backend!r}")
    if _backend == backend:  # on already (the backend asks at every compile): no key to hash, nothing to load
        return
    HostExtension().load()
    with _LOCK:
        if _backend == backend:
            return
        if _backend is not None:
            raise RuntimeError(f"oasr_ops hot path: already serving {_backend}; disable() first")
        python_impl = BACKEND_KERNELS[("oasr::gemm", "CUDA")][0]
        lib = torch.library.Library("oasr", "IMPL")
        lib.impl("_gemm_py", python_impl, backend)
        removed = unregister_backend_kernel("oasr::gemm", backend)
        try:
            torch.ops.oasr_hot.enable_gemm(backend)
        except Exception:
            register_backend_kernel("oasr::gemm", backend, removed)
            lib._destroy()
            raise
        _python_impl_lib, _backend, installing = lib, backend, True
        _removed[backend] = removed


def disable() -> None:
    """Give `oasr::gemm` back to its Python kernels (a no-op when the hot path is off). The installed plans stay (they
    are forgotten with the Python ones): an `enable()` after it answers their keys at once."""
    global _backend, _python_impl_lib, installing
    with _LOCK:
        if _backend is None:
            return
        collect_calls()
        installing = False
        torch.ops.oasr_hot.disable()
        register_backend_kernel("oasr::gemm", _backend, _removed.pop(_backend))
        _python_impl_lib._destroy()
        _python_impl_lib, _backend = None, None


def install_gemm(config: str, dtype: torch.dtype, activation: str, m: int, n: int, k: int, bias: bool,
                 device: torch.device, plan: Any, epoch: int) -> None:
    """Install a Python plan for its call key (a no-op for a plan without `run.native`, one installed already, or
    one made in a DB epoch that has ended: a reload clears the table, and a plan of the old epoch that another
    thread was about to install must not come back after that clear)."""
    native = getattr(plan.run, "native", None)
    if native is None or _backend is None:
        return
    key = (config, dtype, activation, m, n, k, bias, device)
    if key in _installed:
        return
    with _LOCK:
        if key in _installed or _backend is None or epoch != _database.epoch():
            return
        arm, launcher, split, act, ws = native
        slot = len(_slots)
        torch.ops.oasr_hot.install_gemm(config, dtype, act, m, n, k, bias,
                                        -1 if device.index is None else device.index, arm, launcher, split, ws,
                                        slot, plan.config)
        _slots.append(plan)
        _installed.add(key)


def collect_calls() -> None:
    """Add the calls the C++ table answered since the last collection to their Python plans' `calls`."""
    if not _slots:
        return
    with _LOCK:
        pairs = torch.ops.oasr_hot.drain_calls()
        for i in range(0, len(pairs), 2):
            _slots[pairs[i]].calls += pairs[i + 1]


def clear() -> None:
    """Forget the installed plans (their calls collected first); the next call of each key installs it again."""
    with _LOCK:
        if not _slots and not _installed:
            return
        collect_calls()
        torch.ops.oasr_hot.clear()
        _slots.clear()
        _installed.clear()


_database.on_reload(lambda _epoch: clear())


def enable_from_env() -> None:
    """`enable()` when ``OASR_CPP_HOT_PATH=1`` and CUDA is available; a failure warns once and keeps Python."""
    if os.environ.get(ENV, "").strip().lower() not in ("1", "on", "true", "yes", "cuda"):
        return
    if not torch.cuda.is_available():
        return
    try:
        enable("CUDA")
    except Exception as e:  # noqa: BLE001 - documented fallback: the Python path, one warning
        warnings.warn(f"oasr_ops: {ENV} is set but the C++ hot path is unavailable, using the Python ops: {e}",
                      RuntimeWarning, stacklevel=2)

"""The C++ hot path of the oasr ops a served model calls most (templates/hot_path.cpp), opt-in: `enable()`, or
``OASR_CPP_HOT_PATH=1`` in the environment of a process importing oasr_ops; `backend="oasr"` switches it on when
it compiles without CUDA graphs.

Why: without CUDA graphs a served model is host-bound, and each Python op call costs ~3x the aten call it
replaces (docs/architecture.md, "Without CUDA graphs the host decides"). The C++ path keeps every decision in
Python and replays them: each op's Python implementation (its family's `_cuda`) makes a call key's plan as before
and, while the hot path is on, installs it in the C++ table (`install`); the next call of that key is answered in
C++ (gemm's torch arm, or the plan's kernel launched through the launcher's C function pointer). A call C++ cannot
answer (no plan for its key yet, an operand that fails a check, a misaligned pointer, an out_scale whose values
Python has not checked at its current version) goes to the Python implementation, registered for it as
`oasr::_<op>_py`, so errors, warnings and fallbacks are exactly the Python path's.

Served ops (`OPS`): gemm, scaled_mm, scaled_mm_quant, scaled_mm_act_quant, scaled_mm_residual, conv1d_depthwise,
layer_norm_quant, and the fp8 family's scaled_mm_fp8, scaled_mm_fp8_quant, scaled_mm_fp8_act_quant,
scaled_mm_fp8_residual (the int8 ops' keys, params and launchers with e4m3 operands; their torch arm,
torch._scaled_mm, stays in Python).
What each tells the table (`install`): the integers its Python plan key holds besides the config, in the order
the C++ hit path builds them, and the launch constants of its plan (`run.native` = (arm, launcher, params)):

  gemm                ints (dtype, activation code, M, N, K, bias, device); params (split, activation, workspace)
                      — arms: torch, torch with cuBLASLt's fused ReLU, kernel
  scaled_mm*          ints (variant, M, N, K, bias, device), variant = the out dtype (scaled_mm[_fp8],
                      scaled_mm[_fp8]_residual), the activation code (scaled_mm[_fp8]_act_quant: gelu 2, silu 3),
                      0 (scaled_mm[_fp8]_quant); bias = 0 or 1, for the int8 scaled_mm_act_quant 0 or its
                      element's code (fp32 1, fp16 2, bf16 3); params (workspace, scale/bias vector alignment,
                      expand a per-tensor scale_w) — kernels only (the int8 torch arms are Python reference code,
                      the fp8 ones torch._scaled_mm with Python epilogues: they stay there)
  conv1d_depthwise    ints (x dtype, w dtype, bias: -1 or (dtype, rank, sizes, device), x rank and sizes, w rank
                      and sizes, padding, layout code, activation code, glu, x device, w device); params (B, T, C,
                      Kw, activation, glu) — kernels only
  layer_norm_quant    ints (x dtype, M, N, weight and bias: -1 or their dtype, normalized, scheme: 0 int8 1 fp8,
                      eps's float64 bits, x device); no params (the launcher checks its problem; an unaligned row it
                      refuses goes to Python) — kernels only (the reference stays Python)

Dtypes are c10 ScalarType codes (asked from the library), devices `device_code`.

`enable(backend)` takes one backend key over: it removes the Python kernel of each served op at that key
(families/autograd.py keeps each backend kernel in a Library of its own for this), registers the Python
implementation as `oasr::_<op>_py` there, and lets the C++ library register the ops at the key and at its
Autograd key. `disable()` undoes it. The backend is CUDA; CPU exists for the CPU suite (stub kernel launchers).
Plans are forgotten with the Python ones (`reset_plans`, a DB reload); call counts are collected into the Python
plans when `served()` reads them.
"""
from __future__ import annotations

import ctypes
import threading
import warnings
from typing import Any, Callable

import torch

from .. import env as _env
from ..runtime import database as _database
from .autograd import BACKEND_KERNELS, register_backend_kernel, unregister_backend_kernel

ENV = "OASR_CPP_HOT_PATH"
ARM_TORCH, ARM_TORCH_FUSED_RELU, ARM_KERNEL = 0, 1, 2
ACTIVATION_CODES = {"none": 0, "relu": 1, "gelu": 2, "silu": 3}
OPS = {"gemm": 0, "scaled_mm": 1, "scaled_mm_quant": 2, "scaled_mm_act_quant": 3, "scaled_mm_residual": 4,
       "conv1d_depthwise": 5, "layer_norm_quant": 6, "scaled_mm_fp8": 7, "scaled_mm_fp8_quant": 8,
       "scaled_mm_fp8_act_quant": 9, "scaled_mm_fp8_residual": 10}  # templates/hot_path.cpp `Op`
_DEVICE_TYPES = {"cpu": 0, "cuda": 1}  # c10::DeviceType

_LOCK = threading.RLock()
_backend: str | None = None
_served: tuple[str, ...] = ()
_python_impl_lib: Any = None  # the Library registering oasr::_<op>_py at the backend key
_twins_lib: Any = None  # the Library defining the oasr::_<op>_py schemas (kept for the process)
_removed: dict[str, Any] = {}  # op -> the Python kernel that enable() unregistered at the backend key
_slots: list = []  # slot -> the Python Plan whose calls the C++ table counts
_installed: set[tuple] = set()
_dtype_codes: dict[torch.dtype, int] = {}
installing = False  # read by the Python implementations on every call: install plans while the hot path is on


def native_torch(activation: str, fused_relu: bool = False) -> tuple[int, int, tuple[int, ...]]:
    """What a gemm torch-arm plan tells the C++ table: (arm, launcher, params)."""
    return (ARM_TORCH_FUSED_RELU if fused_relu else ARM_TORCH, 0, (0, ACTIVATION_CODES[activation], 0))


def native_kernel(cdll_function: Any, *params: int) -> tuple[int, int, tuple[int, ...]]:
    """What a kernel plan tells the C++ table: the launcher's C function pointer and the op's launch constants
    (module docstring)."""
    return (ARM_KERNEL, int(ctypes.cast(cdll_function, ctypes.c_void_p).value), tuple(int(p) for p in params))


def dtype_code(dtype: torch.dtype) -> int:
    """The c10 ScalarType code of `dtype` (what the C++ side reads off a tensor)."""
    code = _dtype_codes.get(dtype)
    if code is None:
        code = _dtype_codes[dtype] = int(torch.ops.oasr_hot.scalar_type_code(dtype))
    return code


def device_code(device: torch.device) -> int:
    """A device as one integer, as templates/hot_path.cpp `device_code` computes it."""
    return _DEVICE_TYPES[device.type] * 256 + (-1 if device.index is None else device.index) + 1


def enabled() -> str | None:
    """The backend key the hot path serves ("CUDA", "CPU"), or None."""
    return _backend


def served_ops() -> tuple[str, ...]:
    """The ops the hot path serves now (empty when off)."""
    return _served


def _python_twin(name: str) -> None:
    """Define `oasr::_<name>_py`, `oasr::<name>`'s schema under another name (once per process)."""
    try:
        getattr(torch.ops.oasr, f"_{name}_py")
        return
    except AttributeError:
        pass
    global _twins_lib
    if _twins_lib is None:
        _twins_lib = torch.library.Library("oasr", "FRAGMENT")
    schema = str(torch._library.utils.lookup_op(f"oasr::{name}")._schema).split("::", 1)[1]
    _twins_lib.define(f"_{name}_py" + schema[len(name):])


def enable(backend: str = "CUDA", ops: tuple[str, ...] | None = None) -> None:
    """Build (once, cached like the kernels) and load the C++ library, then serve `ops` (default: all of `OPS`) at
    `backend` from it. Raises BuildError / LoadError (codegen/host_ext.py) when it cannot, leaving the Python path in
    place. Switch it on before serving, not while other threads call the ops: between the Python kernels' removal and
    the C++ ones' registration (microseconds) a call of an op at that key finds no kernel."""
    global _backend, _served, _python_impl_lib, installing
    from ..codegen.host_ext import HostExtension

    if backend not in ("CUDA", "CPU"):
        raise ValueError(f"oasr_ops hot path: backend must be 'CUDA' or 'CPU', got {backend!r}")
    ops = tuple(OPS) if ops is None else tuple(ops)
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise ValueError(f"oasr_ops hot path: it does not serve {unknown}; it serves {list(OPS)}")
    if _backend == backend and set(ops) == set(_served):  # on already (the backend asks at every compile)
        return
    HostExtension().load()
    with _LOCK:
        if _backend == backend and set(ops) == set(_served):
            return
        if _backend is not None:
            raise RuntimeError(f"oasr_ops hot path: already serving {list(_served)} at {_backend}; disable() first")
        lib = torch.library.Library("oasr", "IMPL")
        removed: dict[str, Any] = {}
        try:
            for op in ops:
                _python_twin(op)
                lib.impl(f"_{op}_py", BACKEND_KERNELS[(f"oasr::{op}", "CUDA")][0], backend)
            for op in ops:
                removed[op] = unregister_backend_kernel(f"oasr::{op}", backend)
            torch.ops.oasr_hot.enable(backend, [OPS[op] for op in ops])
        except Exception:
            for op, fn in removed.items():
                register_backend_kernel(f"oasr::{op}", backend, fn)
            lib._destroy()
            raise
        _python_impl_lib, _backend, _served, installing = lib, backend, ops, True
        _removed.update(removed)


def disable() -> None:
    """Give the ops back to their Python kernels (a no-op when the hot path is off). The installed plans stay (they
    are forgotten with the Python ones): an `enable()` after it answers their keys at once."""
    global _backend, _served, _python_impl_lib, installing
    with _LOCK:
        if _backend is None:
            return
        collect_calls()
        installing = False
        torch.ops.oasr_hot.disable()
        for op in _served:
            register_backend_kernel(f"oasr::{op}", _backend, _removed.pop(op))
        _python_impl_lib._destroy()
        _python_impl_lib, _backend, _served = None, None, ()


def install(op: str, config: str, ints: tuple[int, ...], plan: Any, epoch: int,
            out_scale: torch.Tensor | None = None) -> None:
    """Install a Python plan of `op` for its call key (`ints`: module docstring) — a no-op for a plan without
    `run.native`, one installed already, an op not served, or a plan made in a DB epoch that has ended (a reload
    clears the table, and a plan of the old epoch that another thread was about to install must not come back after
    that clear). `out_scale`: a quantizing op's out_scale whose values Python has just found valid at its current
    version (scaled_mm/out_scale.py); the C++ side then takes calls with it."""
    native = getattr(plan.run, "native", None)
    if native is None or _backend is None or op not in _served:
        return
    key = (op, config, ints)
    if key not in _installed:
        with _LOCK:
            if key in _installed or _backend is None or op not in _served or epoch != _database.epoch():
                return
            arm, launcher, params = native
            slot = len(_slots)
            torch.ops.oasr_hot.install(OPS[op], config, list(ints), arm, launcher, list(params), slot, plan.config)
            _slots.append(plan)
            _installed.add(key)
    if out_scale is not None:
        torch.ops.oasr_hot.out_scale_passed(out_scale)


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


def plan_cache_functions(cache: Any) -> tuple[Callable[[], list], Callable[[], None]]:
    """`served` and `reset_plans` for a family whose plans (`cache`, a runtime.plans.PlanCache) the hot path copies:
    the C++ table's call counts collected first, its copies forgotten with the plans."""
    def served() -> list:
        """Every plan this process has run, with its call count (the calls the C++ table answered included)."""
        collect_calls()
        return cache.served()

    def reset_plans() -> None:
        """Forget resolved plans, and the C++ hot path's copies of them."""
        clear()
        cache.clear()
    return served, reset_plans


def enable_from_env() -> None:
    """`enable()` when ``OASR_CPP_HOT_PATH=1`` and CUDA is available; a failure warns once and keeps Python."""
    if not _env.cpp_hot_path():
        return
    if not torch.cuda.is_available():
        return
    try:
        enable("CUDA")
    except Exception as e:  # noqa: BLE001 - documented fallback: the Python path, one warning
        warnings.warn(f"oasr_ops: {ENV} is set but the C++ hot path is unavailable, using the Python ops: {e}",
                      RuntimeWarning, stacklevel=2)

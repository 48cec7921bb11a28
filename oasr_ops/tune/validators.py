"""Validators stamped on tuning-DB files: what a measurement depended on.

Hard validators (`hard_validators`) decide whether a file can be read at all: schema version, kernel family,
arch family and MMA lane. A mismatch makes the file unusable (the database skips it with a warning).

Soft validators (`current_soft_validators`) describe the toolchain the entries were measured under:

* ``impl``    sha256 over the lane's template text, the source of ``oasr_ops/codegen/*.py`` and the lane's module
              (missing files are hashed as absent, so a partial checkout still gets a stable value);
* ``sku``     the GPU name (`oasr_ops.tune.arch.gpu_sku`), None on a CPU machine;
* ``nvcc``    the nvcc release string, None when nvcc is absent;
* ``cutlass`` the installed ``nvidia-cutlass`` version, None when not installed.

A soft mismatch keeps an entry in service and reports it stale. A current value of None means "unknown on this
machine" (e.g. no GPU on the CPU box) and is never counted as a mismatch.

Nothing here raises: every probe degrades to None. Results are cached per process; `clear_cache()` (called by
`database.reload()`) drops them so a reload re-reads the toolchain.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

from .. import paths

SCHEMA_VERSION = 2
SOFT_KEYS: tuple[str, ...] = ("impl", "sku", "nvcc", "cutlass")
HARD_KEYS: tuple[str, ...] = ("schema", "kernel_family", "arch_family", "lane")

_CODEGEN_DIR = Path(__file__).resolve().parent.parent / "codegen"


def hard_validators(family: str, arch_family: str, lane: str | None) -> dict[str, Any]:
    """The fields a file must carry, verbatim, to be readable for (family, arch, lane)."""
    return {"schema": SCHEMA_VERSION, "kernel_family": family, "arch_family": arch_family, "lane": lane}


def _read_bytes(p: Path) -> bytes:
    try:
        return p.read_bytes()
    except OSError:
        return b"<absent>"


@functools.lru_cache(maxsize=None)
def impl_hash(lane_name: str | None) -> str:
    """sha256 of everything that decides what a lane's kernels compute and how they are built."""
    h = hashlib.sha256()
    files: list[Path] = []
    lane_module: Path | None = None
    template: str | None = None
    if lane_name:
        try:
            from ..codegen.lanes import get_lane

            template = get_lane(lane_name).template
        except Exception:  # an unknown lane still hashes its (absent) module name
            template = None
        lane_module = _CODEGEN_DIR / "lanes" / f"{lane_name}.py"
    if template:
        files.append(paths.templates_dir() / template)
    try:
        files.extend(sorted(_CODEGEN_DIR.glob("*.py")))
    except OSError:
        pass
    if lane_module is not None:
        files.append(lane_module)
    h.update(f"lane={lane_name}\n".encode())
    for f in files:
        # The name (relative to the package) goes in too, so moving code between files changes the hash.
        h.update(f"--{f.name}--\n".encode())
        h.update(_read_bytes(f))
    return h.hexdigest()




def nvcc_version() -> str | None:
    """The nvcc the JIT builds with (None without one): the soft validator for kernels built by another nvcc."""
    from ..codegen.jit import nvcc_version as jit_nvcc_version

    return jit_nvcc_version()


@functools.lru_cache(maxsize=1)
def cutlass_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return version("nvidia-cutlass")
    except PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def _sku() -> str | None:
    try:
        from .arch import gpu_sku

        return gpu_sku()
    except Exception:
        return None


def current_soft_validators(lane_name: str | None) -> dict[str, Any]:
    """This process's soft validators for `lane_name` (see the module docstring). Never raises."""
    return {"impl": impl_hash(lane_name), "sku": _sku(), "nvcc": nvcc_version(), "cutlass": cutlass_version()}


def soft_mismatches(own: dict[str, Any] | None, current: dict[str, Any]) -> list[str]:
    """The soft validator names on which `own` (an entry's validators) differs from `current`.

    A key whose current value is None is unknown here and not compared; an entry with no validators at all
    (an unstamped file) is stale on every key we do know.
    """
    own = own if isinstance(own, dict) else {}
    return [k for k in SOFT_KEYS if current.get(k) is not None and own.get(k) != current.get(k)]


def clear_cache() -> None:
    impl_hash.cache_clear()
    cutlass_version.cache_clear()
    _sku.cache_clear()

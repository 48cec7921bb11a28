"""Validators stamped on tuning-DB files: what a measurement depended on.

Hard validators (`hard_validators`) decide whether a file can be read at all: schema version, kernel family,
arch family and MMA lane. A mismatch makes the file unusable (the database skips it with a warning).

Soft validators (`current_soft_validators`) describe the toolchain the entries were measured under:

* ``impl``    sha256 over the rendered source of every kernel of the lane (`impl_hash`): what the kernels compute,
              independent of how the Python that renders them is organised;
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
    """sha256 of what a lane's kernels compute: the rendered translation unit of every kernel of its space
    (fp16 output; templates with their includes, the emitted CUTLASS types, the launcher). A Python refactor that
    renders the same bytes keeps the stamp; any change to a kernel's source changes it. Falls back to hashing
    the template files when rendering is not possible here (e.g. cutlass_library missing). Never raises."""
    h = hashlib.sha256(f"lane={lane_name}\n".encode())
    if not lane_name:
        return h.hexdigest()
    try:
        from . import registry

        lane = registry.get_lane(lane_name)
        spec = registry.get(lane.family)
        render = spec.render  # codegen's renderer, handed over by the family
        if render is None:
            raise LookupError(f"family {lane.family} declares no kernel renderer")
        for key in sorted({c.kernel_key().id for c in lane.space}):
            h.update(f"--{key}--\n".encode())
            config = next(c for c in lane.space if c.kernel_key().id == key)
            for variant in spec.impl_variants:  # ("fp16",) alone: the bytes hashed before impl_variants existed
                h.update(render(lane, config, variant).encode())
        return h.hexdigest()
    except Exception:  # no renderer here: the templates are the next best description of the kernels
        h.update(b"templates-only\n")
        try:
            for f in sorted(paths.templates_dir().glob("*.j2")):
                h.update(f"--{f.name}--\n".encode())
                h.update(_read_bytes(f))
        except OSError:
            pass
        return h.hexdigest()


def nvcc_version() -> str | None:
    """The nvcc the JIT builds with (None without one): the soft validator for kernels built by another nvcc."""
    return paths.nvcc_version()


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

"""Helpers shared by the reference workloads: CLI-friendly argument parsing, seeded init, sinusoids.

The example models are driven from a CLI (``--model-args size=M dtype=fp16 num_layers=2``), so every public
entry point accepts strings where it would otherwise take ints, dtypes or devices. Everything here is pure
PyTorch and CPU-safe; nothing is imported from ``oasr_ops`` so the workloads stay an independent baseline.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

_DTYPES: dict[str, torch.dtype] = {
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16, "f16": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32, "f32": torch.float32,
}


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.float16`` or any of "fp16"/"float16"/"half"/"bf16"/"fp32"/... (also "torch.float16")."""
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).strip().lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPES)} or a torch.dtype")
    return _DTYPES[key]


def parse_device(device: torch.device | str | None) -> torch.device:
    return torch.device("cpu" if device is None else device)


def parse_int(value: int | str, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def _coerce(value: Any, hint: Any, name: str) -> Any:
    """Turn a CLI string into the dataclass field's type (int, float, bool, str, or ``X | None``)."""
    if not isinstance(value, str):
        return value
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if type(None) in args and value.strip().lower() in ("none", "null", ""):
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is bool:
        low = value.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name} must be a boolean, got {value!r}")
    if hint in (int, float):
        try:
            return hint(value)
        except ValueError:
            raise ValueError(f"{name} must be {hint.__name__}, got {value!r}") from None
    return value


C = TypeVar("C")


def apply_overrides(cfg: C, overrides: dict[str, Any]) -> C:
    """``dataclasses.replace`` with string coercion and a helpful error for unknown keys."""
    hints = typing.get_type_hints(type(cfg))
    names = {f.name for f in dataclasses.fields(cfg)}  # type: ignore[arg-type]
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise TypeError(f"unknown model argument(s) {unknown} for {type(cfg).__name__}; valid: {sorted(names)}")
    return dataclasses.replace(cfg, **{k: _coerce(v, hints[k], k) for k, v in overrides.items()})  # type: ignore[type-var]


M = TypeVar("M", bound=nn.Module)


def seeded_build(factory: Callable[[], M], seed: int, dtype: torch.dtype, device: torch.device) -> M:
    """Construct ``factory()`` with a fixed seed, cast, move, and put it in eval mode.

    Init runs on the CPU in fp32 inside a forked RNG so that (a) the weights are bit-identical whatever the
    target device (a GPU run can be checked against a CPU reference) and (b) the caller's global RNG stream
    is left untouched. ``device="meta"`` skips the (slow, for L) real init: useful to count parameters.
    """
    if device.type == "meta":
        with torch.device("meta"):
            model = factory()
        return model.to(dtype=dtype).eval()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = factory()
    return model.to(device=device, dtype=dtype).eval()


def sinusoids(length: int, channels: int, device: torch.device | None = None,
              max_timescale: float = 10000.0) -> torch.Tensor:
    """Whisper's sinusoidal table, (length, channels) in fp32: [sin(t*w_i) ..., cos(t*w_i) ...].

    Computed in fp32 on purpose: positions up to thousands times high frequencies lose all precision in fp16.
    Callers cast the result to the activation dtype.
    """
    if channels % 2:
        raise ValueError(f"sinusoidal positions need an even width, got {channels}")
    log_inc = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-log_inc * torch.arange(channels // 2, device=device, dtype=torch.float32))
    t = torch.arange(length, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


def random_features(shape: tuple[int, ...], seed: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Deterministic stand-in for log-mel features (roughly unit scale, like normalised log-mels)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)

"""Model quantization schemes, collected from the families: each family that offers a scheme registers a
``quantize_schemes`` handler, ``() -> {scheme: fn(model, config, filter_fn) -> model}`` (the transform is in
place and returns the model, as torchao's ``quantize_``). `oasr_ops.quantize_` and ``oasr tune census
--quantization`` look schemes up here, so neither names a family.
"""
from __future__ import annotations

from typing import Any, Callable

from ..runtime import registry
from .self_attention import quantize_attention


def schemes() -> dict[str, Callable[..., Any]]:
    """Every registered scheme by name (the first family to declare a name wins; registration order)."""
    out: dict[str, Callable[..., Any]] = {}
    for spec in registry.families().values():
        handler = spec.handler("quantize_schemes")
        if handler is not None:
            for name, fn in handler().items():
                out.setdefault(name, fn)
    return out


def quantize(model: Any, scheme: str, config: str = "auto", filter_fn: Callable[[Any, str], bool] | None = None,
             *, who: str = "quantize_") -> Any:
    """Apply `scheme` to `model` in place (see `schemes`); ValueError naming the known schemes otherwise."""
    table = schemes()
    fn = table.get(scheme) if isinstance(scheme, str) else None
    if fn is None:
        raise ValueError(f"{who}: unknown scheme {scheme!r}; supported: {', '.join(sorted(table))}")
    return quantize_attention(model, lambda m: fn(m, config, filter_fn), filter_fn)  # (stock attention too)

"""`quantize_(model, "int8_w8a8")`: swap `nn.Linear` layers for quantized layers, in place (public wrappers).

The transform itself belongs to the family that runs it (``int8_w8a8``: `oasr_ops.families.scaled_mm.quantize`,
where the qualifying rule, the weight quantization and `QuantLinear` are documented); `quantize_` looks the
scheme up among the families' ``quantize_schemes`` handlers (`oasr_ops.families.quantization`).
"""
from __future__ import annotations

from typing import Callable

from torch import nn

from .families import quantization as _quantization
from .families.scaled_mm.quantize import (QuantLinear, qualifies, quantize_weight,  # noqa: F401  (public names)
                                          quantized_linear)


def quantize_(model: nn.Module, scheme: str = "int8_w8a8", *, config: str = "auto",
              filter_fn: Callable[[nn.Module, str], bool] | None = None) -> nn.Module:
    """Replace every qualifying `nn.Linear` of `model` (the model itself included) by a quantized layer.

    `filter_fn(linear, fqn)` (torchao's convention: the module and its fully qualified name) narrows the set:
    a layer is quantized only where it returns True. Per-token quantization of a layer's input is extra work that
    Inductor fuses into a LayerNorm producer almost for free but not into every producer (docs/perf/e2e.md), so a
    deployment may quantize only the layers that follow a norm.
    Mutates `model` in place and returns it (a bare `nn.Linear` passed as `model` is returned converted).
    ValueError for an unknown scheme.
    """
    return _quantization.quantize(model, scheme, config, filter_fn)


def quantization_report(model: nn.Module, arch: str | None = None) -> str:
    """One line: ``scaled_mm: 96 quantized layer(s) over 5 signature(s): 96 with a tuning entry (system=96), 0 on
    the shape heuristic`` — whether each layer's signature has an entry in the user/system tier for `arch`."""
    from .runtime import database
    from .runtime.arch import current_arch_family, normalize_arch

    a = normalize_arch(arch) if arch else current_arch_family()
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    sigs: dict[tuple[int, int], str | None] = {}
    for layer in layers:
        key = (layer.out_features, layer.in_features)
        if key not in sigs:
            tier = None
            if a is not None:
                chain = database.chain("scaled_mm", "scaled_mm", None, key[0], key[1], a)
                tier = chain[0][0] if chain else None
            sigs[key] = tier
    tiers: dict[str, int] = {}
    heuristic = 0
    for layer in layers:
        t = sigs[(layer.out_features, layer.in_features)]
        if t is None:
            heuristic += 1
        else:
            tiers[t] = tiers.get(t, 0) + 1
    tuned = sum(tiers.values())
    detail = ", ".join(f"{t}={tiers[t]}" for t in ("user", "system") if t in tiers)
    return (f"scaled_mm: {len(layers)} quantized layer(s) over {len(sigs)} signature(s): {tuned} with a tuning "
            f"entry{f' ({detail})' if detail else ''}, {heuristic} on the shape heuristic")

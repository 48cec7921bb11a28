"""`quantize_(model, Int8W8A8Config())` (or the string ``"int8_w8a8"``): swap `nn.Linear` (and, int8, qualifying
`nn.Conv2d`) layers for quantized layers, in place — the public wrappers.

torchao's convention: ``quantize_(model, config, filter_fn)``; the config is a frozen dataclass
(`oasr_ops.families.scaled_mm.qconfig`) and a handler registered for its type (`register_quantize_handler`)
transforms the model. A string names a config with its defaults. The transform itself belongs to the family that
runs it (``int8_w8a8``: `oasr_ops.families.scaled_mm.quantize`, where the qualifying rule, the weight quantization
and `QuantLinear` are documented; its convs: `oasr_ops.families.conv2d_activation.quantize`, `QuantConv2d`).
"""
from __future__ import annotations

from typing import Any, Callable

from torch import nn

from .families.conv2d_activation.quantize import QuantConv2d, quantize_convs  # noqa: F401  (public names)
from .families.scaled_mm.qconfig import SCHEMES as _SCHEME_TYPES
from .families.scaled_mm.qconfig import Int8W8A8Config, as_quant_config
from .families.scaled_mm.quantize import (QuantLinear, qualifies, quantize_module,  # noqa: F401  (public names)
                                          quantize_weight, quantized_linear)
from .families.scaled_mm_fp8.qconfig import Fp8W8A8Config
from .families.scaled_mm_fp8.quantize import Fp8QuantLinear
from .families.scaled_mm_fp8.quantize import quantize_module as _quantize_module_fp8
from .families.self_attention import quantize_attention

SCHEMES = tuple(_SCHEME_TYPES)  # the string names quantize_ accepts ("int8_w8a8", "fp8_w8a8")

FilterFn = Callable[[nn.Module, str], bool]
# config type -> fn(model, config, filter_fn) -> model (torchao's config -> handler table)
_HANDLERS: dict[type, Callable[[nn.Module, Any, "FilterFn | None"], nn.Module]] = {}


def register_quantize_handler(config_type: type) -> Callable:
    """Decorator: ``@register_quantize_handler(MyConfig)`` on ``fn(model, config, filter_fn) -> model`` makes
    `quantize_` accept ``MyConfig`` objects."""
    def deco(fn: Callable[[nn.Module, Any, FilterFn | None], nn.Module]) -> Callable:
        _HANDLERS[config_type] = fn
        return fn
    return deco


def quantize_(model: nn.Module, config: Any = "int8_w8a8", filter_fn: FilterFn | None = None) -> nn.Module:
    """Quantize `model` in place with `config` and return it (a bare `nn.Linear` — or, int8, `nn.Conv2d` — passed
    as `model` is returned converted).

    `config`: a config object (`Int8W8A8Config()`, or any type with a `register_quantize_handler`) or a scheme
    string (``"int8_w8a8"`` = ``Int8W8A8Config()``). `filter_fn(module, fqn)` (torchao's convention: the module and
    its fully qualified name) narrows the set: a layer is quantized only where it returns True. Per-token
    quantization of a layer's input is extra work that Inductor fuses into a LayerNorm producer almost for free
    but not into every producer (docs/perf/e2e.md), so a deployment may quantize only the layers after a norm.
    A stock `nn.MultiheadAttention` whose projections `filter_fn` wants (asked as ``"<fqn>.in_proj"`` /
    ``"<fqn>.out_proj"``) is converted to `LinearMultiheadAttention` (the same attention, its projections Linears)
    where one of them gets quantized, and a stock `nn.TransformerEncoder(Layer)` holding quantized layers is kept off PyTorch's fused fast
    path (`oasr_ops.families.self_attention`). ValueError for an unknown scheme string; TypeError for a config type
    without a handler.
    """
    cfg = as_quant_config(config)
    handler = next((_HANDLERS[t] for t in type(cfg).__mro__ if t in _HANDLERS), None)
    if handler is None:
        raise TypeError(f"quantize_: no handler for config type {type(cfg).__name__}; known: "
                        f"{', '.join(t.__name__ for t in _HANDLERS)} (register_quantize_handler adds one)")
    return quantize_attention(model, lambda m: handler(m, cfg, filter_fn), filter_fn)


@register_quantize_handler(Int8W8A8Config)
def _int8_w8a8(model: nn.Module, cfg: Int8W8A8Config, filter_fn: FilterFn | None) -> nn.Module:
    """Every qualifying `nn.Linear` of `model` (the model itself included) becomes a `QuantLinear`, and with
    ``cfg.convs`` every qualifying `nn.Conv2d` a `QuantConv2d`."""
    if cfg.convs and filter_fn is not None:
        filter_fn = _asked_up_front(model, filter_fn, (nn.Linear, nn.Conv2d))
    model = quantize_module(model, cfg.kernel, filter_fn)
    return quantize_convs(model, filter_fn) if cfg.convs else model


def _asked_up_front(model: nn.Module, filter_fn: FilterFn, kinds: tuple[type, ...]) -> FilterFn:
    """`filter_fn`'s answer for every module of `kinds`, all asked before either pass swaps anything: the linears
    are swapped before the convs, so a filter that raised on a conv left the linears quantized."""
    answers = {id(m): bool(filter_fn(m, fqn)) for fqn, m in model.named_modules() if isinstance(m, kinds)}
    return lambda module, fqn: answers.get(id(module), False)


@register_quantize_handler(Fp8W8A8Config)
def _fp8_w8a8(model: nn.Module, cfg: Fp8W8A8Config, filter_fn: FilterFn | None) -> nn.Module:
    """Every qualifying `nn.Linear` of `model` (the model itself included) becomes an `Fp8QuantLinear`."""
    return _quantize_module_fp8(model, cfg.kernel, filter_fn)


_REPORTED = (("scaled_mm", QuantLinear), ("scaled_mm_fp8", Fp8QuantLinear))  # (DB family = its op, layer type)


def quantization_report(model: nn.Module, arch: str | None = None) -> str:
    """One line per quantized family: ``scaled_mm: 96 quantized layer(s) over 5 signature(s): 96 with a tuning
    entry (system=96), 0 on the shape heuristic`` — whether each layer's signature has an entry in the user/system
    tier for `arch`. An int8 line is always given (0 layers when none); an fp8 line when the model has fp8
    layers (``scaled_mm_fp8: ...``); a ``conv2d_int8_activation`` line when it has `QuantConv2d` layers."""
    lines = []
    for family, layer_type in _REPORTED:
        layers = [m for m in model.modules() if isinstance(m, layer_type)]
        if layers or family == "scaled_mm":
            lines.append(_report_line(family, layers, arch))
    convs = [m for m in model.modules() if isinstance(m, QuantConv2d)]
    if convs:  # no DB family: the int8 conv picks its tile by a rule (ops_int8.untuned_tile)
        lines.append(f"conv2d_int8_activation: {len(convs)} quantized conv(s), {sum(c.calibrated for c in convs)} "
                     "calibrated, tiles by the untuned rule (not tuned)")
    return "\n".join(lines)


def _report_line(family: str, layers: list[nn.Module], arch: str | None) -> str:
    from .runtime import database
    from .runtime.arch import current_arch_family, normalize_arch

    a = normalize_arch(arch) if arch else current_arch_family()
    sigs: dict[tuple[int, int], str | None] = {}
    for layer in layers:
        key = (layer.out_features, layer.in_features)
        if key not in sigs:
            tier = None
            if a is not None:
                chain = database.chain(family, family, None, key[0], key[1], a)
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
    return (f"{family}: {len(layers)} quantized layer(s) over {len(sigs)} signature(s): {tuned} with a tuning "
            f"entry{f' ({detail})' if detail else ''}, {heuristic} on the shape heuristic")

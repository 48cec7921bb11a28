"""`oasr_ops.calibrate(model, batches)`: static per-tensor input scales for int8 / fp8 layers, from representative data.

Runs `model` eagerly (no_grad) on every batch, records amax(|input|) of each quantized layer (`QuantLinear`,
`Fp8QuantLinear`, `QuantConv2d`: a `quantize_`d model) or else of each qualifying `nn.Linear` (K % 16 == 0,
N % 8 == 0) and `nn.Conv2d` (families/conv2d_activation/quantize.py), and stores:

* on a quantized layer (after `quantize_`) ``scale = max(amax, tiny) / qmax`` (fp32 [1]; qmax = the layer's
  `input_qmax`: 127 for int8, 448 for e4m3) as its ``input_scale`` buffer — saved in its state dict, loaded back by
  a quantized model (`CalibratedInput._load_from_state_dict`);
* for a plain `nn.Linear` / `nn.Conv2d` (the ``options={"quantization": ...}`` path quantizes in the graph) the amax, in a weak
  table keyed by the layer's weight `nn.Parameter`; the in-graph quantization reads it as the scale of its scheme
  (`calibrated_scale(weight, qmax)`: 127 for int8_w8a8, 448 for fp8_w8a8), so one calibration serves both.

Who uses the scale: only the backend's fusion pass, where a GEMM's output goes through an activation into the next
quantized GEMM (fc1 -> GELU/SiLU -> fc2): fc1's epilogue quantizes with fc2's calibrated scale
(`oasr::scaled_mm_act_quant`, `oasr::scaled_mm_fp8_act_quant`). Every other quantization stays dynamic per token
(LayerNorm outputs through `oasr::layer_norm_quant` or Inductor). Per tensor, not per row: the epilogue cannot see
a whole row (N is split over CTAs).
"""
from __future__ import annotations

import math
import warnings
import weakref
from typing import Any, Callable, Iterable

import torch
from torch import nn

from .quantize import CalibratedInput, qualifies

# id(weight) -> (weak reference to it, amax); by identity (a WeakKeyDictionary would compare tensors with ==)
_BY_WEIGHT: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
_READ: set[int] = set()  # ids of weights whose scale a compile pass has read (baked into a graph)
QMAX = 127.0  # int8
# The largest quantized value of each scheme's activations: a plain layer's scale is its amax over this.
QMAX_OF = {"int8_w8a8": 127.0, "fp8_w8a8": 448.0}


def scale_of(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """The per-tensor scale (fp32 [1]) quantizing values up to `amax` onto [-qmax, qmax]."""
    return (amax.clamp_min(1e-12) / qmax).reshape(1).to(torch.float32)


def calibrated_scale(weight: Any, qmax: float = QMAX, *, baked: bool = True) -> torch.Tensor | None:
    """The calibrated input scale (amax / `qmax`: 127 int8, 448 e4m3) of the plain `nn.Linear` owning `weight`,
    or None. `baked`: the caller puts the value into a graph (so a later `calibrate` warns that graph keeps it);
    False for a mere "is it calibrated" question."""
    entry = _BY_WEIGHT.get(id(weight))
    if entry is None or entry[0]() is not weight:
        return None
    if baked:
        _READ.add(id(weight))
    return scale_of(entry[1], qmax)


def _remember(weight: nn.Parameter, amax: torch.Tensor) -> bool:
    """Store `weight`'s layer's input amax; True when a compiled graph had read a different one (it keeps that)."""
    key = id(weight)
    old = _BY_WEIGHT.get(key)
    stale = (key in _READ and old is not None and old[0]() is weight
             and not torch.equal(old[1].cpu(), amax.detach().cpu()))

    def forget(_r: Any, _k: int = key) -> None:
        _BY_WEIGHT.pop(_k, None)
        _READ.discard(_k)

    _BY_WEIGHT[key] = (weakref.ref(weight, forget), amax)
    return stale


def _layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The quantized layers of a `quantize_`d model (int8 and fp8, convs included); the qualifying `nn.Linear`s and
    `nn.Conv2d`s of a model that has none."""
    from ..conv2d_activation.quantize import qualifies as conv_qualifies

    quant = [(name, m) for name, m in model.named_modules() if isinstance(m, CalibratedInput)]
    if quant:
        return quant
    return [(name, m) for name, m in model.named_modules()
            if (isinstance(m, nn.Linear) and qualifies(m)) or conv_qualifies(m)]


def calibrate(model: nn.Module, batches: Iterable[Any], forward: Callable[[nn.Module, Any], Any] | None = None,
              filter_fn: Callable[[nn.Module, str], bool] | None = None,
              scheme: str = "int8_w8a8") -> dict[str, float]:
    """Record per-tensor input scales (module docstring); returns ``{fqn: scale}``. `batches`: an iterable of
    inputs, each passed as ``model(*b)`` when a tuple/list, ``model(**b)`` when a dict, else ``model(b)`` (or
    `forward(model, b)`). `filter_fn(module, fqn)` narrows the layers. `scheme` (``"int8_w8a8"`` or
    ``"fp8_w8a8"``) only sets the scales *returned* for a plain model's layers (what it stores is the amax,
    which both schemes read); a quantized layer's scale is its own scheme's. ValueError when no batch was given,
    for an unknown scheme, or when a layer's inputs held NaN or inf (nothing is stored then); a layer whose inputs
    were all zeros stays dynamic, with one warning naming it. A `torch.compile`d model is calibrated through the
    module it wraps (run eagerly: a compiled graph runs no hooks). A plain layer whose previous scale a compiled
    graph already holds (``options={"quantization": ...}`` bakes it) gets the new one, with one warning that those
    graphs keep the old one until compiled again."""
    if scheme not in QMAX_OF:
        raise ValueError(f"calibrate: scheme must be one of {', '.join(QMAX_OF)}, got {scheme!r}")
    # a torch.compile'd model: its graph never runs the layers' hooks, so calibrate the module it wraps (eagerly)
    from torch._dynamo.eval_frame import OptimizedModule

    model = model._orig_mod if isinstance(model, OptimizedModule) else model
    amax: dict[str, torch.Tensor] = {}
    hooks = []
    chosen = [(n, m) for n, m in _layers(model) if filter_fn is None or filter_fn(m, n)]
    for name, layer in chosen:
        def hook(_mod, args, kwargs, _name=name):
            # the layer's input, positional or by its name (`input`: nn.Linear's, nn.Conv2d's and the quantized layers')
            x = args[0] if args else kwargs.get("input")
            if not isinstance(x, torch.Tensor):
                return
            x = x.detach()
            a = x.abs().amax().float() if x.numel() else torch.zeros((), device=x.device)
            prev = amax.get(_name)
            amax[_name] = a if prev is None else torch.maximum(prev, a)
        hooks.append(layer.register_forward_pre_hook(hook, with_kwargs=True))
    seen = 0
    try:
        with torch.no_grad():
            for b in batches:
                seen += 1
                if forward is not None:
                    forward(model, b)
                elif isinstance(b, dict):
                    model(**b)
                elif isinstance(b, (tuple, list)):
                    model(*b)
                else:
                    model(b)
    finally:
        for h in hooks:
            h.remove()
    if not seen:
        raise ValueError("calibrate: no batches (pass an iterable of representative model inputs)")
    # Checked before anything is stored: a NaN or inf amax (an fp16 overflow, a corrupted batch) would store a
    # scale that quantizes every later input to garbage or zero, and a zero amax (a layer that saw only zeros)
    # one that saturates every later input; the first is an error, the second leaves the layer dynamic.
    names = list(amax)
    values = torch.stack([amax[n].float().cpu() for n in names]).tolist() if names else []
    not_finite = [n for n, v in zip(names, values) if not math.isfinite(v)]
    if not_finite:
        raise ValueError(f"calibrate: the inputs of {len(not_finite)} layer(s) held NaN or inf in these batches "
                         f"({', '.join(not_finite[:4])}{', ...' if len(not_finite) > 4 else ''}); no scale was "
                         "stored. Check the batches (a corrupted input, an fp16 overflow before the layer).")
    zero = [n for n, v in zip(names, values) if v == 0.0]
    if zero:
        warnings.warn(f"calibrate: the inputs of {len(zero)} layer(s) were all zeros in every batch "
                      f"({', '.join(zero[:4])}{', ...' if len(zero) > 4 else ''}); no scale is stored for them, as "
                      "for a layer not reached (uncalibrated layers quantize with dynamic per-token scales)",
                      stacklevel=2)
        for n in zero:
            del amax[n]
    out: dict[str, float] = {}
    recompiled: list[str] = []
    for name, layer in chosen:
        if name not in amax:
            continue  # not reached by these batches (or all zeros): left dynamic
        if isinstance(layer, CalibratedInput):
            scale = scale_of(amax[name], layer.input_qmax)
            layer.input_scale = scale.to(layer.weight_q.device)
        else:
            scale = scale_of(amax[name], QMAX_OF[scheme])
            if _remember(layer.weight, amax[name].to(layer.weight.device)):
                recompiled.append(name)
        out[name] = float(scale)
    if recompiled:  # options={"quantization": ...} bakes a plain layer's scale into the graph it compiles
        warnings.warn(f"calibrate: {len(recompiled)} layer(s) ({', '.join(recompiled[:4])}"
                      f"{', ...' if len(recompiled) > 4 else ''}) had been compiled with their previous scales, which "
                      "those compiled graphs keep: compile again (a new torch.compile, or torch._dynamo.reset()) to "
                      "serve the new ones", stacklevel=2)
    return out

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

`oasr_ops.check_calibration(model, batches)` measures, on other data, how far inputs exceed those static ranges
(where a static scale clips them).
"""
from __future__ import annotations

import math
import warnings
import weakref
from dataclasses import dataclass
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


def _eager_module(model: nn.Module) -> nn.Module:
    """The module a `torch.compile`d model wraps (its graph never runs the layers' hooks), else `model`."""
    from torch._dynamo.eval_frame import OptimizedModule

    return model._orig_mod if isinstance(model, OptimizedModule) else model


def run_batch(model: nn.Module, batch: Any, forward: Callable[[nn.Module, Any], Any] | None = None) -> Any:
    """One batch through `model` as `calibrate` documents: ``forward(model, b)`` when given, else ``model(**b)`` for
    a dict, ``model(*b)`` for a tuple/list, ``model(b)`` otherwise."""
    if forward is not None:
        return forward(model, batch)
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def _observe(model: nn.Module, batches: Iterable[Any], forward: Callable[[nn.Module, Any], Any] | None,
             layers: list[tuple[str, nn.Module]], record: Callable[[str, torch.Tensor], None]) -> int:
    """Run `model` eagerly (no_grad) on every batch (as `calibrate` documents), calling ``record(fqn, input)`` with
    the (detached) input of each of `layers` on each call; returns the number of batches."""
    hooks = []
    for name, layer in layers:
        def hook(_mod, args, kwargs, _name=name):
            # the layer's input, positional or by its name (`input`: nn.Linear's, nn.Conv2d's and the quantized layers')
            x = args[0] if args else kwargs.get("input")
            if isinstance(x, torch.Tensor):
                record(_name, x.detach())
        hooks.append(layer.register_forward_pre_hook(hook, with_kwargs=True))
    seen = 0
    try:
        with torch.no_grad():
            for b in batches:
                seen += 1
                run_batch(model, b, forward)
    finally:
        for h in hooks:
            h.remove()
    return seen


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
    model = _eager_module(model)
    amax: dict[str, torch.Tensor] = {}
    chosen = [(n, m) for n, m in _layers(model) if filter_fn is None or filter_fn(m, n)]

    def record(name: str, x: torch.Tensor) -> None:
        a = x.abs().amax().float() if x.numel() else torch.zeros((), device=x.device)
        prev = amax.get(name)
        amax[name] = a if prev is None else torch.maximum(prev, a)

    seen = _observe(model, batches, forward, chosen, record)
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


@dataclass(frozen=True)
class RangeCheck:
    """One calibrated layer's input range on the batches `check_calibration` ran: the calibrated amax (its
    scale x qmax), the largest |input| seen, and the fraction of input values beyond the calibrated amax (those a
    static scale clips to it)."""

    calibrated_amax: float
    observed_amax: float
    clipped_fraction: float

    @property
    def overshoot(self) -> float:
        """observed / calibrated amax: > 1 means the static scale clips some inputs."""
        return self.observed_amax / self.calibrated_amax


OVERSHOOT_WARN = 1.25  # check_calibration's default: warn past 25 % more than the calibrated range


def _calibrated_amax(layer: nn.Module) -> float | None:
    """The amax a layer's static input scale covers (scale x qmax), or None when it has no calibrated scale."""
    if isinstance(layer, CalibratedInput):
        scale = layer.input_scale
        return None if scale is None else float(scale) * layer.input_qmax
    entry = _BY_WEIGHT.get(id(getattr(layer, "weight", None)))
    return None if entry is None or entry[0]() is not layer.weight else float(entry[1])


def check_calibration(model: nn.Module, batches: Iterable[Any],
                      forward: Callable[[nn.Module, Any], Any] | None = None,
                      filter_fn: Callable[[nn.Module, str], bool] | None = None,
                      warn_overshoot: float = OVERSHOOT_WARN) -> dict[str, RangeCheck]:
    """Check stored calibrations against new data (held-out or production traffic): runs `model` eagerly on
    `batches` as `calibrate` does and returns ``{fqn: RangeCheck}`` for every calibrated layer the batches reached.

    Why: a static scale clips every input beyond the range it was calibrated on, and only some paths use it (fc2's
    input in a compiled act-quant GEMM, a calibrated `QuantConv2d`); an eager `QuantLinear` quantizes per token, so
    a compiled model fed larger inputs than its calibration data silently departs from the eager one. One warning
    names the layers whose inputs exceeded their calibrated amax by more than `warn_overshoot` (x1.25 by
    default); recalibrate on batches that include such data. ValueError when no batch was given, `warn_overshoot`
    is not a number >= 1, or the model has no calibrated layer. Reads the device once, after the last batch."""
    if not (isinstance(warn_overshoot, (int, float)) and math.isfinite(warn_overshoot) and warn_overshoot >= 1):
        raise ValueError(f"check_calibration: warn_overshoot must be a finite number >= 1, got {warn_overshoot!r}")
    model = _eager_module(model)
    calibrated = {n: a for n, m in _layers(model) if (filter_fn is None or filter_fn(m, n))
                  and (a := _calibrated_amax(m)) is not None}
    if not calibrated:
        raise ValueError("check_calibration: no layer of this model has a calibrated input scale "
                         "(run oasr_ops.calibrate(model, batches) first)")
    layers = [(n, m) for n, m in model.named_modules() if n in calibrated]
    # per layer: largest |x| and the count of values beyond the calibrated amax (device tensors, read once at the
    # end), and the count of values. The threshold allows for the scale's fp32 round trip (amax / qmax * qmax):
    # the calibration data's own maximum is not clipped.
    stats: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    counts: dict[str, int] = {}

    def record(name: str, x: torch.Tensor) -> None:
        if not x.numel():
            return
        ax = x.abs().float()
        new = (ax.amax(), (ax > calibrated[name] * (1 + 1e-6)).sum())
        old = stats.get(name)
        stats[name] = new if old is None else (torch.maximum(old[0], new[0]), old[1] + new[1])
        counts[name] = counts.get(name, 0) + x.numel()

    if not _observe(model, batches, forward, layers, record):
        raise ValueError("check_calibration: no batches (pass an iterable of model inputs)")
    names = list(stats)
    values = torch.stack([torch.stack([t.double() for t in stats[n]]) for n in names]).cpu().tolist() if names else []
    out = {n: RangeCheck(calibrated[n], amax, clipped / counts[n]) for n, (amax, clipped) in zip(names, values)}
    over = [n for n, r in out.items() if not r.overshoot <= warn_overshoot]  # a NaN input counts as over
    if over:
        worst = max(over, key=lambda n: out[n].overshoot if math.isfinite(out[n].overshoot) else math.inf)
        warnings.warn(f"check_calibration: the inputs of {len(over)} layer(s) ({', '.join(over[:4])}"
                      f"{', ...' if len(over) > 4 else ''}) exceeded their calibrated range by more than "
                      f"x{warn_overshoot:g} (worst {worst}: {out[worst].observed_amax:.4g} vs "
                      f"{out[worst].calibrated_amax:.4g}, {out[worst].clipped_fraction:.2%} of its values clipped); "
                      "their static scales clip those inputs in compiled act-quant GEMMs and calibrated convs. "
                      "Calibrate again on batches that include such data", stacklevel=2)
    return out

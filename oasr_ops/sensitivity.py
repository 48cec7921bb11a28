"""Which layers a quantization scheme can take within an accuracy budget, measured on the user's own data.

`quantization_sensitivity(model, batches, config)` quantizes one layer at a time (every layer `quantize_` would
quantize with `config` and `filter_fn`), runs the model on `batches` and records the output error of each
single-layer model against a reference (the unquantized model's own outputs, or the outputs the caller passes:
an fp32 model's, say). `error_budget_filter(model, batches, config, max_error)` turns that into a `quantize_`
filter: the layers in an order of "error per gain", as many as the measured error of the *combined* model allows
(the largest prefix found by bisection, each candidate prefix measured, not summed), so
``quantize_(model, config, filter_fn=plan)`` quantizes exactly the layers whose joint error was measured.

The order: uncorrelated per-layer errors add in quadrature (docs/perf/e2e.md measured it on both encoders), so a
layer spends ``e_i^2 - e_0^2`` of the budget (e_0: the unquantized model's own error) and buys its GEMM's share of
the time; a greedy knapsack takes the layers by ascending ``(e_i^2 - e_0^2) / gain_i``. Default gain: the weight's
element count (the layer's FLOPs per token: in an encoder every Linear sees the same tokens); ``gain=lambda m,
fqn: 1.0`` orders by error alone. A FLOP is not a measured speed-up: a layer whose input quantization cannot be
fused (an fc2 whose fc1 stays fp16) pays a separate pass, so pass a speed filter (`fusable_filter`): the budget
chooses among its layers and keeps each fc2 behind its fc1 (its ``requires``). Then measure the compiled model
(docs/perf/e2e.md, session 27: on the Whisper-style encoder a budget ordered by error alone, without the pairs,
chose layers that made it slower than fp16).

Why: e4m3 keeps 3 mantissa bits, so an fp8 W8A8 encoder lands at 4.5-5e-2 max relative error where int8 lands at
1-2e-2 (docs/perf/e2e.md); which layers carry that error is a property of the model and its data, which only a
measurement on them answers.

What is measured is the eager model: every quantized layer quantizes its input per token (dynamic). A compiled
model whose fc1 -> activation -> fc2 sites use a calibrated static scale (``fuse_quantization``) differs a little:
measure the compiled model's error once more. Cost: one pass over `batches` per candidate layer, plus about
log2(layers) + 1 passes for the budget; the quantized copy of every candidate layer is held while it runs
(int8/e4m3 weights: half the size of fp16 ones).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import nn
from torch.utils import _pytree

from .families.scaled_mm.calibrate import _eager_module, run_batch
from .families.scaled_mm.quantize import swaps
from .families.self_attention import attention_conversions
from .quantize import FilterFn, quantize_

ErrorFn = Callable[[Any, Any], float]
GainFn = Callable[[nn.Module, str], float]


def weight_numel(module: nn.Module, fqn: str) -> float:
    """The default gain of quantizing a layer: its weight's element count (its GEMM's FLOPs per token)."""
    return float(module.weight.numel())


def max_relative_error(out: Any, ref: Any) -> float:
    """max |out - ref| / max |ref| over every floating tensor of the two outputs (the same structure): the metric
    of docs/perf/e2e.md. NaN when an output holds NaN or inf (it never counts as within a budget)."""
    outs, refs = _float_leaves(out), _float_leaves(ref)
    if len(outs) != len(refs) or not outs:
        raise ValueError(f"quantization_sensitivity: the model's output has {len(outs)} floating tensor(s), the "
                         f"reference {len(refs)}; they must match (and be at least one)")
    if any(o.shape != r.shape for o, r in zip(outs, refs)):
        raise ValueError("quantization_sensitivity: the model's output and the reference differ in shape: "
                         f"{[tuple(o.shape) for o in outs]} vs {[tuple(r.shape) for r in refs]}")
    diff = max(float((o.double() - r.to(o.device).double()).abs().max()) if o.numel() else 0.0
               for o, r in zip(outs, refs))
    scale = max(float(r.double().abs().max()) if r.numel() else 0.0 for r in refs)
    if not math.isfinite(diff):
        return math.nan
    return diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)


def _float_leaves(x: Any) -> list[torch.Tensor]:
    return [t.detach() for t in _pytree.tree_leaves(x) if isinstance(t, torch.Tensor) and t.is_floating_point()]


@dataclass(frozen=True)
class Sensitivity:
    """`quantization_sensitivity`'s answer. `baseline`: the unquantized model's error against the reference (0
    when the reference is the model itself); `layers`: fqn -> the error with only that layer quantized (the worst
    over the batches), in the model's module order."""

    baseline: float
    layers: dict[str, float]

    def ranked(self) -> list[tuple[str, float]]:
        """(fqn, error), least harmful first (NaN last: a layer that broke the output)."""
        return sorted(self.layers.items(), key=lambda kv: (math.isnan(kv[1]), kv[1]))

    def table(self, top: int | None = None) -> str:
        """The layers, most harmful first, one per line: ``error  fqn`` (the first `top` when given)."""
        rows = self.ranked()[::-1][:top]
        lines = [f"baseline (no layer quantized): {self.baseline:.3e}"]
        lines += [f"{err:.3e}  {fqn}" for fqn, err in rows]
        return "\n".join(lines)


@dataclass(frozen=True)
class ErrorBudgetFilter:
    """A `quantize_` filter_fn (``plan(module, fqn) -> bool``) choosing `layers` (in the order they were taken),
    with what was measured: `error` is the model's error with exactly those layers quantized (<= `max_error` on
    the batches it ran), `sensitivity` the per-layer errors it ordered them by."""

    layers: tuple[str, ...]
    error: float
    max_error: float
    sensitivity: Sensitivity
    measured: dict[int, float] = field(default_factory=dict)  # prefix length -> its measured error (the bisection)

    def __call__(self, module: nn.Module, fqn: str) -> bool:
        return fqn in self.layers

    def summary(self) -> str:
        n = len(self.sensitivity.layers)
        return (f"{len(self.layers)} of {n} candidate layer(s) within max error {self.max_error:.3g}: measured "
                f"{self.error:.3e} (baseline {self.sensitivity.baseline:.3e})")


class _Swapper:
    """Every candidate layer of `model` with its quantized copy, swapped in and out by fqn (`apply`)."""

    def __init__(self, model: nn.Module, config: Any, filter_fn: FilterFn | None) -> None:
        self.sites: dict[str, tuple[nn.Module, str, nn.Module, nn.Module]] = {}
        # A stock nn.MultiheadAttention's projections are candidates under the names quantize_ gives them. quantize_
        # converts the module (`LinearMultiheadAttention`) only when one of them is chosen, so `apply` installs
        # the converted module exactly then: each measured model is the one quantize_ with that choice gives.
        self._attention = attention_conversions(model, filter_fn)
        for parent, name, _stock, conv in self._attention:
            setattr(parent, name, conv)

        def wanted(m: nn.Module, fqn: str) -> bool:
            return isinstance(m, (nn.Linear, nn.Conv2d)) and (filter_fn is None or bool(filter_fn(m, fqn)))

        parent_names = {id(m): n for n, m in model.named_modules()}
        seen: set[int] = set()
        for parent, name, child in swaps(model, wanted):
            if id(child) in seen:
                continue  # a layer reachable under two names: measured under the first
            seen.add(id(child))
            q = quantize_(child, config)  # a bare layer comes back converted, or as itself when it does not qualify
            if q is not child:
                prefix = parent_names[id(parent)]
                self.sites[f"{prefix}.{name}" if prefix else name] = (parent, name, child, q)
        self.apply(())  # every converted attention module back to the stock one until one of its layers is chosen

    def apply(self, chosen: Iterable[str]) -> None:
        """Quantize exactly the layers in `chosen`; every other candidate gets its original back."""
        on = set(chosen)
        converted = set()
        for fqn, (parent, name, child, q) in self.sites.items():
            setattr(parent, name, q if fqn in on else child)
            if fqn in on:
                converted.add(id(parent))
        for parent, name, stock, conv in self._attention:
            setattr(parent, name, conv if id(conv) in converted else stock)


def _check_args(model: nn.Module, batches: Iterable[Any], reference: Sequence[Any] | None, who: str) -> list[Any]:
    if not isinstance(model, nn.Module):
        raise TypeError(f"{who}: model must be a torch.nn.Module, got {type(model).__name__}")
    if model.training:  # dropout would make every measured error a random draw
        warnings.warn(f"{who}: the model is in training mode (dropout makes each measured error random); call "
                      "model.eval() first", stacklevel=4)
    batch_list = list(batches)
    if not batch_list:
        raise ValueError(f"{who}: no batches (pass a list of representative model inputs)")
    if reference is not None and len(reference) != len(batch_list):
        raise ValueError(f"{who}: reference has {len(reference)} output(s) for {len(batch_list)} batch(es); pass "
                         "one per batch, in order")
    return batch_list


def _error(model: nn.Module, batches: list[Any], reference: Sequence[Any],
           forward: Callable[[nn.Module, Any], Any] | None, error_fn: ErrorFn) -> float:
    """The worst error over the batches (NaN if any is NaN)."""
    worst = 0.0
    with torch.no_grad():
        for b, ref in zip(batches, reference):
            e = float(error_fn(run_batch(model, b, forward), ref))
            if math.isnan(e):
                return math.nan
            worst = max(worst, e)
    return worst


def _reference(model: nn.Module, batches: list[Any], reference: Sequence[Any] | None,
               forward: Callable[[nn.Module, Any], Any] | None) -> Sequence[Any]:
    if reference is not None:
        return reference
    with torch.no_grad():
        return [_pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t,
                                 run_batch(model, b, forward)) for b in batches]


def _prepare(model: nn.Module, batches: Iterable[Any], config: Any, filter_fn: FilterFn | None,
             forward: Callable[[nn.Module, Any], Any] | None, reference: Sequence[Any] | None,
             who: str) -> tuple[nn.Module, list[Any], _Swapper, Sequence[Any]]:
    """Both entry points' start: the arguments checked, the eager module, its candidates, the reference outputs."""
    batch_list = _check_args(model, batches, reference, who)
    model = _eager_module(model)
    ref = _reference(model, batch_list, reference, forward)  # the model as it came (before any conversion)
    return model, batch_list, _Swapper(model, config, filter_fn), ref


def _measure(swapper: _Swapper, model: nn.Module, batches: list[Any], reference: Sequence[Any],
             forward: Callable[[nn.Module, Any], Any] | None, error_fn: ErrorFn) -> Sensitivity:
    try:
        swapper.apply(())
        baseline = _error(model, batches, reference, forward, error_fn)
        layers = {}
        for fqn in swapper.sites:
            swapper.apply((fqn,))
            layers[fqn] = _error(model, batches, reference, forward, error_fn)
    finally:
        swapper.apply(())
    return Sensitivity(baseline, layers)


def quantization_sensitivity(model: nn.Module, batches: Iterable[Any], config: Any = "int8_w8a8", *,
                             filter_fn: FilterFn | None = None,
                             forward: Callable[[nn.Module, Any], Any] | None = None,
                             reference: Sequence[Any] | None = None,
                             error_fn: ErrorFn = max_relative_error) -> Sensitivity:
    """Per layer, the output error with only that layer quantized with `config` (module docstring).

    `batches`: model inputs, each run as ``model(*b)`` (tuple/list), ``model(**b)`` (dict), ``model(b)``, or
    ``forward(model, b)``. `filter_fn(module, fqn)` narrows the candidate layers (those `quantize_` would
    quantize with `config`). `reference`: one output per batch to compare against (default: the unquantized
    model's outputs). `error_fn(out, ref) -> float`: default `max_relative_error`. The model is left as it came
    (each layer is swapped back, also on an exception); a `torch.compile`d model is measured through the module it
    wraps. ValueError when no batch is given or `reference` does not match the batches."""
    model, batch_list, swapper, ref = _prepare(model, batches, config, filter_fn, forward, reference,
                                               "quantization_sensitivity")
    return _measure(swapper, model, batch_list, ref, forward, error_fn)


def _knapsack_order(sens: Sensitivity, layers: dict[str, nn.Module], gain: GainFn, max_error: float) -> list[str]:
    """The candidates (fqn -> original layer) within `max_error` alone, by ascending budget spent per gain:
    ``(e_i^2 - e_0^2) / gain_i`` (ties: module order)."""
    cost: dict[str, float] = {}
    for fqn, err in sens.layers.items():
        if fqn not in layers or not err <= max_error:  # NaN: never
            continue
        g = gain(layers[fqn], fqn)
        if not (isinstance(g, (int, float)) and math.isfinite(g) and g > 0):
            raise ValueError(f"error_budget_filter: gain({fqn!r}) must be a positive number, got {g!r}")
        cost[fqn] = max(err * err - sens.baseline * sens.baseline, 0.0) / g
    return sorted(cost, key=cost.__getitem__)


def _after_prerequisites(order: list[str], requires: dict[str, str]) -> list[str]:
    """`order` with each layer's prerequisite (``requires[fqn]``) moved just before it; a layer whose prerequisite
    is not in `order` (or a cycle) is dropped."""
    allowed, out, placed = set(order), [], set()

    def place(fqn: str, chain: frozenset[str]) -> bool:
        if fqn in placed:
            return True
        pre = requires.get(fqn)
        if pre is not None and (pre not in allowed or pre in chain or not place(pre, chain | {fqn})):
            return False
        out.append(fqn)
        placed.add(fqn)
        return True

    for fqn in order:
        place(fqn, frozenset())
    return out


def error_budget_filter(model: nn.Module, batches: Iterable[Any], config: Any, max_error: float, *,
                        filter_fn: FilterFn | None = None,
                        forward: Callable[[nn.Module, Any], Any] | None = None,
                        reference: Sequence[Any] | None = None,
                        error_fn: ErrorFn = max_relative_error,
                        gain: GainFn = weight_numel,
                        requires: Mapping[str, str] | None = None,
                        sensitivity: Sensitivity | None = None) -> ErrorBudgetFilter:
    """A `quantize_` filter_fn: the longest prefix of the layers ordered by ``(e_i^2 - e_0^2) / gain(layer, fqn)``
    whose combined error on `batches` is within `max_error` (module docstring; the other arguments as
    `quantization_sensitivity`, whose result can be passed as `sensitivity` to skip that measurement). A layer
    whose own error exceeds `max_error` is never taken. `requires` (fqn -> fqn; default: `filter_fn.requires`
    when the filter has one, as `fusable_filter`'s does) makes a layer follow the one it is fusable only with: an
    fc2 is taken with its fc1 placed just before it, and not at all when its fc1 is not a candidate (an fc2 alone
    pays a separate quantization pass of the hidden). The combined error is measured for every prefix the
    bisection tries; it assumes the error grows with the prefix (it usually does; where it does not, a longer
    prefix may also fit: the answer is a measured fit, not the optimum). ValueError when `max_error` is not a
    positive number, when a gain is not a positive number, or when the unquantized model's own error (against
    `reference`) already exceeds `max_error`. Every layer swapped back."""
    if not (isinstance(max_error, (int, float)) and math.isfinite(max_error) and max_error > 0):
        raise ValueError(f"error_budget_filter: max_error must be a positive number, got {max_error!r}")
    model, batch_list, swapper, ref = _prepare(model, batches, config, filter_fn, forward, reference,
                                               "error_budget_filter")
    sens = sensitivity if sensitivity is not None else _measure(swapper, model, batch_list, ref, forward, error_fn)
    if not sens.baseline <= max_error:
        raise ValueError(f"error_budget_filter: the unquantized model's error is already {sens.baseline:.3e} > "
                         f"max_error {max_error:.3g} against this reference: no layer can be quantized")
    order = _knapsack_order(sens, {fqn: site[2] for fqn, site in swapper.sites.items()}, gain, max_error)
    deps = getattr(filter_fn, "requires", None) if requires is None else requires
    if deps:
        order = _after_prerequisites(order, dict(deps))
    measured: dict[int, float] = {0: sens.baseline}

    def fits(k: int) -> bool:
        if k not in measured:
            try:
                swapper.apply(order[:k])
                measured[k] = _error(model, batch_list, ref, forward, error_fn)
            finally:
                swapper.apply(())
        return measured[k] <= max_error

    lo, hi = 0, len(order)  # fits(lo) holds; find the largest k in [lo, hi] that fits
    if order and fits(hi):
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return ErrorBudgetFilter(tuple(order[:lo]), measured[lo], float(max_error), sens, dict(sorted(measured.items())))


__all__ = ["ErrorBudgetFilter", "Sensitivity", "error_budget_filter", "max_relative_error",
           "quantization_sensitivity", "weight_numel"]

"""The int8 W8A8 model transform (scheme ``int8_w8a8``): `QuantLinear`, weight quantization, the quantized
linear both `QuantLinear` and the backend's in-graph quantization run, and the in-place module swap behind
`oasr_ops.quantize_` (registered as this family's ``quantize_schemes`` handler).

A layer qualifies when its GEMM fits the int8 kernels: K (in_features) % 16 == 0 and N (out_features) % 8 == 0;
the others stay as they are (full precision). Weights are quantized once, symmetric per output channel
(``scale_w[n] = amax(|W[n, :]|) / 127``, ``W_q = clamp(round(W / scale_w), -127, 127)``); activations are
quantized per token at every call (`torch.ops.oasr.quantize_per_token`, a composite op that Inductor fuses),
then `torch.ops.oasr.scaled_mm` runs the GEMM with config ``auto`` (the tuning DB's ``scaled_mm`` family, else
the int8 shape heuristic).

Output dtype: the layer's own dtype when it is fp16/bf16; an fp32 layer computes in fp16 (the int8 kernels
write fp16/bf16) and casts the result back to fp32. The bias is kept in that output dtype.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

from ...runtime.plans import WarnOnce

SCHEME = "int8_w8a8"
SCHEMES = (SCHEME,)


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8: (w_q int8 [N, K], scale_w fp32 [N]) with w ≈ w_q * scale_w[:, None]."""
    wf = w.detach().float()
    scale = wf.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    q = torch.round(wf / scale[:, None]).clamp_min(-127.0).clamp_max(127.0).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def quantized_linear(x: torch.Tensor, weight_q: torch.Tensor, scale_w: torch.Tensor, bias: torch.Tensor | None,
                     out_dtype: torch.dtype, config: str = "auto",
                     input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` of an int8 W8A8 layer: per-token activation quantization, then `oasr::scaled_mm`. Shared by
    `QuantLinear` and the backend's `options={"quantization": ...}` rewrite, so both run the same ops. A calibrated
    `input_scale` ([1], `oasr_ops.calibrate`) rides along for the fusion pass (the op still quantizes per token)."""
    check_input_width(x, weight_q)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, weight_q.shape[1]).contiguous()
    if input_scale is None:
        q, scale_a = torch.ops.oasr.quantize_per_token(x2)
    else:
        q, scale_a = torch.ops.oasr.quantize_per_token_calibrated(x2, input_scale)
    y = torch.ops.oasr.scaled_mm(q, weight_q, scale_a, scale_w, bias, out_dtype, config)
    y = y.reshape(*lead, weight_q.shape[0])
    want = linear_result_dtype(x)
    return y if y.dtype == want else y.to(want)


_AUTOCAST_DEVICES = ("cuda", "cpu", "xpu")


def linear_result_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype `F.linear(x, ...)` returns: autocast's for x's device when it is on there, else x's. A quantized
    layer writes its own 16-bit dtype; returning x's dtype under autocast gave an fp32 model's autocast region fp32
    activations between its quantized layers (twice the bytes, and not what the stock layer returned)."""
    dev = x.device.type
    if dev in _AUTOCAST_DEVICES and torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return x.dtype


def check_input_width(x: torch.Tensor, weight_q: torch.Tensor) -> None:
    """ValueError unless `x` is ``[..., K]`` for the layer's ``[N, K]`` weight (as `F.linear` would say)."""
    k = weight_q.shape[1]
    if x.dim() == 0 or x.shape[-1] != k:
        raise ValueError(f"quantized linear: the input must be [..., in_features={k}], got shape {tuple(x.shape)}")


def qualifies(linear: nn.Linear) -> bool:
    return linear.in_features % 16 == 0 and linear.out_features % 8 == 0 and linear.in_features > 0


_WARN_DTYPE = WarnOnce()  # once per layer class: an output dtype it cannot take
_WARN_WEIGHT = WarnOnce()  # once per layer class: `.weight` read (a dequantized copy)


class CalibratedInput(nn.Module):
    """A quantized linear layer (int8 `QuantLinear`, fp8 `Fp8QuantLinear`).

    Buffers: ``weight_q`` ([N, K]), ``scales`` (fp32: the N per-channel weight scales, then — once calibrated
    (`oasr_ops.calibrate`) — the layer input's per-tensor scale, amax / `input_qmax`: [N] or [N + 1]) and ``bias``
    ([N] in the output dtype; [0] when the layer has none: it still carries the output dtype). `scale_w`,
    `input_scale`, `out_dtype`, `calibrated`, `in_features` and `out_features` are read from these tensors.

    Why this layout (host time per call, docs/perf/e2e.md): a compiled model re-checks Dynamo's guards on every
    call. Everything `forward` reads is a buffer (its shape and dtype, which tensor guards check anyway) or a
    class attribute — no instance attribute — so the layer's guard subtree is "tag safe": with
    ``torch._dynamo.config.use_recursive_dict_tags_for_guards = True`` Dynamo skips it while the module's dicts are
    unchanged (measured on the CPU, Conformer M int8: 216 -> ~37 us per call; fp16 nn.Linear layers: 26 us).
    A config other than ``auto`` is the one instance attribute (`config`), read only when set. One `scales`
    buffer instead of two: fewer tensors per layer, fewer guards. State dicts of the earlier layouts load."""

    input_qmax: float = 127.0  # the largest quantized value of the layer's activations (int8: 127; e4m3: 448)
    linear_fn: Callable | None = None  # a linear layer's quantized linear function (`rows` calls it)
    scheme: str = SCHEME
    config: str = "auto"       # a per-layer config name; an instance attribute only when not "auto"

    def _init_buffers(self, weight_q: torch.Tensor, scale_w: torch.Tensor, bias: torch.Tensor | None,
                      out_dtype: torch.dtype, config: str) -> None:
        if out_dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"{type(self).__name__}: out_dtype must be float16 or bfloat16, got {out_dtype}")
        n = weight_q.shape[0]
        if tuple(scale_w.shape) != (n,):
            raise ValueError(f"{type(self).__name__}: scale_w must have shape ({n},), got {tuple(scale_w.shape)}")
        if config != type(self).config:
            self.config = config
        self.register_buffer("weight_q", weight_q)
        self.register_buffer("scales", scale_w.detach().float().reshape(-1).contiguous())
        self.register_buffer("bias", weight_q.new_empty(0, dtype=out_dtype) if bias is None
                             else bias.detach().to(out_dtype).contiguous())

    # what forward passes to the quantized linear: buffers and their static shapes / dtypes only (see the class doc)
    def _linear_args(self) -> tuple:
        n = self.weight_q.shape[0]
        scales, bias = self.scales, self.bias
        return (self.weight_q, scales[:n], bias if bias.shape[0] else None, bias.dtype, self.config,
                scales[n:] if scales.shape[0] > n else None)

    def rows(self, start: int, stop: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """The layer restricted to its output channels [start, stop), as a callable: per-channel weights slice
        exactly (a packed projection's q, or k and v, part: `LinearMultiheadAttention`). Its input is quantized
        per token; a calibrated input scale is not carried (it was recorded over the whole layer's inputs)."""
        if type(self).linear_fn is None:
            raise TypeError(f"{type(self).__name__} is not a linear layer: it has no rows")
        weight_q, scale_w, bias, out_dtype, config, _ = self._linear_args()
        args = (weight_q[start:stop], scale_w[start:stop], None if bias is None else bias[start:stop], out_dtype,
                config, None)
        return lambda x: type(self).linear_fn(x, *args)

    @property
    def out_features(self) -> int:
        return self.weight_q.shape[0]

    @property
    def in_features(self) -> int:
        return self.weight_q.shape[1]

    @property
    def out_dtype(self) -> torch.dtype:
        """The dtype the kernel writes (fp16 / bf16). forward returns `F.linear`'s: the input's, or autocast's
        under torch.autocast (`linear_result_dtype`), cast when it differs."""
        return self.bias.dtype

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight (``weight_q`` x per-channel ``scale_w``, in the output dtype, the replaced layer's
        shape): a fresh read-only copy, so code that reads ``layer.weight`` (its shape, dtype, device, values) keeps
        working, with one warning per layer class. It is not what the layer computes with: changing it changes
        nothing, and assigning it raises."""
        _WARN_WEIGHT(type(self), f"{type(self).__name__}.weight is a 16-bit copy dequantized on each read: fine for "
                     "its shape, dtype or values, but code computing with it (a parent module calling F.linear on "
                     "it instead of calling the layer) runs in 16-bit, not on the quantized kernels")
        n = self.out_features
        w = self.weight_q.float() * self.scale_w.reshape(n, *([1] * (self.weight_q.dim() - 1)))
        return self._weight_layout(w).to(self.out_dtype)

    @weight.setter
    def weight(self, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__}.weight is a dequantized copy of weight_q, not a parameter: "
                             "quantize the new weights instead (quantize_ on a float layer holding them)")

    @staticmethod
    def _weight_layout(w: torch.Tensor) -> torch.Tensor:
        """weight_q's layout -> the replaced layer's weight layout (a linear's is the same)."""
        return w

    @property
    def calibrated(self) -> bool:
        return self.scales.shape[0] > self.out_features

    @property
    def scale_w(self) -> torch.Tensor:
        return self.scales[:self.out_features]

    @property
    def input_scale(self) -> torch.Tensor | None:
        """fp32 [1]: the calibrated per-tensor scale of this layer's input, or None (dynamic per token only)."""
        return self.scales[self.out_features:] if self.calibrated else None

    @input_scale.setter
    def input_scale(self, value: torch.Tensor | None) -> None:
        n = self.out_features
        if value is None:
            self.scales = self.scales[:n].clone()
            return
        if value.numel() != 1:
            raise ValueError(f"{type(self).__name__}.input_scale: one value per tensor, got shape "
                             f"{tuple(value.shape)}")
        with torch.no_grad():
            self.scales = torch.cat([self.scales[:n], value.detach().to(self.scales).reshape(1)])

    def _apply(self, fn, recurse=True):
        """`.to()` / `.cuda()` / `.half()` / `.bfloat16()` / `.float()` of a quantized model: every buffer moves with
        the device, but a dtype change reaches only the output dtype (``bias``), and only fp16 / bf16, which the
        kernels write. ``weight_q`` (int8 / e4m3) and ``scales`` (fp32) keep their dtypes — nn.Module's default
        casts every floating buffer, which turned an e4m3 weight or the fp32 scales into bf16. Another output
        dtype (``.float()``) keeps the layer's, with one warning."""
        keep = {k: self._buffers.pop(k) for k in ("weight_q", "scales", "bias")}
        try:
            super()._apply(fn, recurse)
        finally:
            for k, t in keep.items():
                moved = fn(t)
                if moved.dtype != t.dtype and not (k == "bias" and moved.dtype in (torch.float16, torch.bfloat16)):
                    if k == "bias":
                        _WARN_DTYPE(type(self), f"{type(self).__name__}: a quantized layer outputs float16 or "
                                    f"bfloat16; asked for {moved.dtype} (.to() / .float()), it keeps {t.dtype}")
                    moved = t.to(device=moved.device)
                self._buffers[k] = moved
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        n = self.out_features
        old_w, old_in = prefix + "scale_w", prefix + "input_scale"  # the layout before `scales`
        if old_w in state_dict and prefix + "scales" not in state_dict:
            scale_in = state_dict.pop(old_in, None)
            parts = [state_dict.pop(old_w).float().reshape(-1)]
            if scale_in is not None:
                parts.append(scale_in.float().reshape(1))
            state_dict[prefix + "scales"] = torch.cat(parts)
        extra = state_dict.pop(prefix + "_extra_state", None)  # session 6's layout: scales [N + 1] + a flag
        if extra is not None and not extra.get("calibrated", False) and prefix + "scales" in state_dict:
            state_dict[prefix + "scales"] = state_dict[prefix + "scales"][:n]
        if prefix + "bias" not in state_dict and self.bias.shape[0] == 0:
            state_dict[prefix + "bias"] = self.bias  # a layer without bias: earlier layouts saved none
        incoming = state_dict.get(prefix + "scales")
        if incoming is not None and incoming.shape != self.scales.shape:  # calibrated or not: take the saved size
            self.scales = torch.empty_like(incoming, dtype=torch.float32, device=self.scales.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias.shape[0] > 0}, out_dtype={self.out_dtype}, scheme={self.scheme}, "
                f"calibrated={self.calibrated}")


class QuantLinear(CalibratedInput):
    """An int8 W8A8 linear layer: int8 weight + fp32 per-channel scale (buffers), dynamic per-token activations."""

    linear_fn = staticmethod(quantized_linear)  # what `rows` calls (forward calls it directly)

    def __init__(self, weight_q: torch.Tensor, scale_w: torch.Tensor, bias: torch.Tensor | None,
                 out_dtype: torch.dtype, config: str = "auto") -> None:
        super().__init__()
        self._init_buffers(weight_q, scale_w, bias, out_dtype, config)

    @classmethod
    def from_linear(cls, linear: nn.Linear, config: str = "auto") -> "QuantLinear":
        wq, sw = quantize_weight(linear.weight)
        dt = linear.weight.dtype
        out_dtype = dt if dt in (torch.float16, torch.bfloat16) else torch.float16
        return cls(wq, sw, linear.bias, out_dtype, config)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # nn.Linear's name: `layer(input=x)` keeps working
        return quantized_linear(input, *self._linear_args())


def quantize_module(model: nn.Module, config: str = "auto",
                    filter_fn: Callable[[nn.Module, str], bool] | None = None) -> nn.Module:
    """Replace every qualifying `nn.Linear` of `model` (the model itself included) by a `QuantLinear`, in place;
    `filter_fn(linear, fqn)` narrows the set. Returns `model` (a bare `nn.Linear` is returned converted)."""

    def wanted(linear: nn.Module, fqn: str) -> bool:
        return isinstance(linear, nn.Linear) and qualifies(linear) and (filter_fn is None or filter_fn(linear, fqn))

    check_model(model)
    if isinstance(model, nn.Linear):
        return QuantLinear.from_linear(model, config) if wanted(model, "") else model
    for parent, name, child in swaps(model, wanted):
        setattr(parent, name, QuantLinear.from_linear(child, config))
    return model


def check_model(model: object) -> None:
    """TypeError unless `model` is an `nn.Module` (what `quantize_` transforms)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"quantize_: model must be a torch.nn.Module, got {type(model).__name__}")


def swaps(model: nn.Module, wanted: Callable[[nn.Module, str], bool]) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute name, child) of every child of `model`'s modules that `wanted(child, fqn)` selects, all
    decided before any swap: a `filter_fn` that raises leaves the model as it was, not half quantized. Never a
    `NonDynamicallyQuantizableLinear` (torch's mark on `nn.MultiheadAttention.out_proj`, whose parent reads its
    weight instead of calling it: a swapped one ran in 16-bit on the dequantized copy, or failed in an fp32 model);
    `wanted` is not asked about those."""
    return [(parent, name, child) for parent_name, parent in list(model.named_modules())
            for name, child in list(parent.named_children())
            if not isinstance(child, NonDynamicallyQuantizableLinear)
            and wanted(child, f"{parent_name}.{name}" if parent_name else name)]


def schemes() -> dict[str, Callable[..., nn.Module]]:
    """The `quantize_schemes` handler: scheme name -> ``fn(model, config, filter_fn) -> model``."""
    return {SCHEME: quantize_module}

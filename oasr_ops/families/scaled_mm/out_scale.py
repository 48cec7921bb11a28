"""The value check of a quantizing op's ``out_scale`` (int8 `scaled_mm_quant` / `scaled_mm_act_quant`, fp8
`scaled_mm_fp8_quant` / `scaled_mm_fp8_act_quant`): every value finite and > 0, else a ValueError naming the op
(a NaN, inf or 0 scale would quantize to garbage silently).

Reading values synchronizes the device, so a scale is read once, not per call. An out_scale is almost always a
calibrated buffer (`oasr_ops.calibrate`) or a slice of one (`QuantLinear.scales[N:]`). In eager code a slice is a
view whose `_base` is the long-lived module buffer; the cache is keyed by that base, with the base's version counter
(shared by its views: an in-place change bumps it and the values are read again), the view's data pointer and size.
A compiled graph without CUDA graphs passes a fresh alias of the buffer on every call (Inductor's
`reinterpret_tensor`), which has no `_base` and its own version counter (always 0); such a tensor is keyed by its
storage (one Python object per storage, kept alive by the buffer), so it is read on the first call only — an
in-place change to the buffer after that first compiled call is not re-read there (recalibrating writes valid
values; eager calls and a recompile see the change). Before the storage key, each act-quant GEMM of a compiled
model in default mode paid a device sync and five small kernels per call (32 per Conformer-M forward, visible in
`e2e_int8_fused.py --profile` as `Memcpy DtoH`), also after session 7's base-buffer key, which assumed `_base`.
Tensors without a version counter (created in inference mode) are read on every call. The check is skipped inside
a CUDA-graph capture and while torch.compile traces (the values are not inspectable there).
"""
from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

# base tensor or storage -> (the version when checked, {(data_ptr, numel) of the views of it that passed})
_CHECKED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _values_ok(out_scale: torch.Tensor) -> bool:
    """The read itself (a device sync on the GPU): every value finite and > 0."""
    return bool(((out_scale > 0) & torch.isfinite(out_scale)).all())


def check_out_scale(out_scale: torch.Tensor, op: str = "scaled_mm_quant", name: str = "out_scale") -> bool:
    """ValueError (naming `oasr.<op>`) unless every value of `out_scale` is finite and > 0; see the module doc.
    Returns whether the values are known valid at the tensor's current version (checked now or before; False when
    the check was skipped, or for a tensor without a version counter): what the C++ hot path may rely on
    (families/hot_path.py)."""
    if out_scale.device.type == "cuda" and (torch.cuda.is_current_stream_capturing()
                                            or torch.compiler.is_compiling()):
        return False
    # the cache key (module docstring): a view's base with the base's version, else the storage with the tensor's
    # own version (a plain tensor's in-place changes bump it; a compiled graph's alias is always at 0)
    owner = out_scale._base if out_scale._base is not None else out_scale
    base = owner if owner is not out_scale else out_scale.untyped_storage()
    try:
        version, view = owner._version, (out_scale.data_ptr(), out_scale.numel())
    except RuntimeError:  # an inference-mode tensor has no version counter: check it every time
        version, view = None, None
    if version is not None:
        seen = _CHECKED.get(base)
        if seen is not None and seen[0] == version and view in seen[1]:
            return True
    if out_scale.numel() and not _values_ok(out_scale):
        raise ValueError(f"oasr.{op}: {name} must be finite and > 0 everywhere, got "
                         f"{out_scale.detach().flatten()[:4].tolist()}{'...' if out_scale.numel() > 4 else ''}")
    if version is not None:
        seen = _CHECKED.get(base)
        if seen is None or seen[0] != version:
            seen = (version, set())
            _CHECKED[base] = seen
        seen[1].add(view)
    return version is not None

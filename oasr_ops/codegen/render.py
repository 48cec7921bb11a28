"""Lane + config + dtype -> complete `.cu` source (emitter output wrapped by the lane's Jinja template).

Shared by JIT builds and `oasr tune prebuild`: the same function renders the same bytes, so both find the
same cache entry.
"""
from __future__ import annotations

from ..configs import Config, Lane
from .templates import ABI_VERSION  # noqa: F401  (re-exported: the loader checks it)
from .templates import environment as _env

_ELEMENT = {"fp16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t"}


def render(lane: Lane, config: Config, dtype: str) -> str:
    """The full translation unit for one kernel. Raises ValueError for a config outside the lane or a bad dtype."""
    if lane.family == "scaled_mm":  # the int8 W8A8 lanes: their own emitter and templates (emit_int8.py)
        from .emit_int8 import render_scaled_mm

        return render_scaled_mm(lane, config, dtype)
    if lane.family == "scaled_mm_fp8":  # the fp8 W8A8 lanes: emit_fp8.py and their own templates
        from .emit_fp8 import render_scaled_mm_fp8

        return render_scaled_mm_fp8(lane, config, dtype)
    if lane.family == "bmm":
        return _render_bmm(lane, config, dtype)
    if lane.family == "conv1d":  # the depthwise conv1d lanes: a plain CUDA template, no emitter
        from .render_conv1d import render_conv1d

        return render_conv1d(lane, config, dtype, _env())
    if lane.family == "conv2d_activation":  # direct conv + CUTLASS 2.x implicit-GEMM fprop: their own templates
        from .render_conv2d import render_conv2d

        return render_conv2d(lane, config, dtype, _env())
    if dtype not in _ELEMENT:
        raise ValueError(f"dtype {dtype!r} not supported by {lane.name} (fp16, bf16)")
    if config.kernel_key() not in {c.kernel_key() for c in lane.space}:
        raise ValueError(f"config {config.id} is not in lane {lane.name}")
    from . import emit  # cutlass_library is imported on the first render, not with the package

    config = config.kernel_key()
    if config.generation == "3x":
        emitted = emit.emit_sm90(config, dtype, "OasrEVT")
    else:
        emitted = emit.emit_sm80(config, dtype, "OasrOutputOp")
    return _render_template(lane, config, dtype, dtype, emitted)


def _render_template(lane: Lane, config: Config, label: str, dtype: str, emitted, **extra) -> str:
    """The fp16/bf16 lanes' template around an emitted kernel; `label` is the variant the source names."""
    return _env().get_template(lane.template).render(
        lane=lane.name,
        config_id=config.id,
        dtype=label,
        element=_ELEMENT[dtype],
        tile=list(config.tile),
        includes=list(emitted.includes),
        definition=emitted.definition,
        operation_name=emitted.operation_name,
        abi_version=ABI_VERSION,
        **extra,
    )


# A bmm kernel's variant (its JitSpec "dtype"): element type and B operand layout.
B_MAJORS = ("k", "n")


def kernel_variant(dtype: str, b_major: str) -> str:
    """The JitSpec "dtype" of one bmm kernel: element type and B layout."""
    if b_major not in B_MAJORS:
        raise ValueError(f"B major must be one of {B_MAJORS}, got {b_major!r}")
    return f"{dtype}_b{b_major}"


def split_variant(variant: str) -> tuple[str, str]:
    """Inverse of `kernel_variant`; ValueError for anything else."""
    dtype, sep, major = variant.rpartition("_b")
    if not sep or major not in B_MAJORS or dtype not in ("fp16", "bf16"):
        raise ValueError(f"bmm kernel variant {variant!r} is not <fp16|bf16>_b<k|n>")
    return dtype, major



# Version of the bmm family's launcher (`oasr_bmm_*`), checked by the loader in oasr_ops/bmm.py.
BMM_ABI_VERSION = 1


def _render_bmm(lane: Lane, config: Config, variant: str) -> str:
    """A bmm kernel: `variant` is ``<dtype>_b<k|n>`` (lanes/sm90_f16_bmm.py)."""
    dtype, b_major = split_variant(variant)
    if config not in lane.space:
        raise ValueError(f"config {config.id} is not in lane {lane.name}")
    from . import emit

    layout = emit.L.LayoutType.ColumnMajor if b_major == "k" else emit.L.LayoutType.RowMajor
    emitted = emit.emit_sm90(config, dtype, "OasrEVT", b_layout=layout)
    return _render_template(lane, config, variant, dtype, emitted, b_major=b_major, bmm_abi_version=BMM_ABI_VERSION)

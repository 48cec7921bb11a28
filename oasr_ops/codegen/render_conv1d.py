"""The conv1d family's kernels: lane + depthwise config + variant -> a complete `.cu` source.

No CUTLASS emitter: `templates/conv1d_depthwise.cu.j2` is the whole kernel, parameterised by the config's
explicit fields (tile over frames and channels, vector width, threads) and the variant (JitSpec "dtype"):
``<fp16|bf16>_<bct|btc>``, the element type and the activation layout ([B, C, T] or [B, T, C]).
"""
from __future__ import annotations

from ..configs import DW_MAX_KW, Config, Lane
from .templates import ABI_VERSION

# Version of the conv1d family's launcher (`oasr_dwconv_*`), checked by the loader (families/conv1d/kernels.py).
DWCONV_ABI_VERSION = 2  # 2: the GLU prologue flag (`glu` after `act`)
LAYOUTS = ("bct", "btc")
KERNEL_WIDTHS = tuple(range(3, DW_MAX_KW + 1, 2))  # every odd Kw the op accepts is its own instantiation
_ELEMENT = {"fp16": "__half", "bf16": "__nv_bfloat16"}


def dw_variant(dtype: str, layout: str) -> str:
    """The JitSpec "dtype" of one depthwise kernel: element type and activation layout."""
    if dtype not in _ELEMENT:
        raise ValueError(f"depthwise conv dtype must be one of {tuple(_ELEMENT)}, got {dtype!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"depthwise conv layout must be one of {LAYOUTS}, got {layout!r}")
    return f"{dtype}_{layout}"


def split_dw_variant(variant: str) -> tuple[str, str]:
    """Inverse of `dw_variant`; ValueError for anything else."""
    dtype, sep, layout = str(variant).partition("_")
    if not sep:
        raise ValueError(f"depthwise conv kernel variant {variant!r} is not <fp16|bf16>_<bct|btc>")
    dw_variant(dtype, layout)
    return dtype, layout


def render_conv1d(lane: Lane, config: Config, variant: str, env) -> str:
    """A depthwise conv1d kernel. Raises ValueError for a config outside the lane or a bad variant."""
    dtype, layout = split_dw_variant(variant)
    if config not in lane.space or config.generation != "dw":
        raise ValueError(f"config {config.id} is not in lane {lane.name}")
    tile_t, tile_c, _ = config.tile
    return env.get_template(lane.template).render(
        lane=lane.name,
        config_id=config.id,
        dtype=variant,
        element=_ELEMENT[dtype],
        layout=layout,
        tile_t=tile_t,
        tile_c=tile_c,
        vec=config.alignment,
        threads=config.threads,
        rows=tile_t * tile_c // config.threads,
        kernel_widths=list(KERNEL_WIDTHS),
        abi_version=ABI_VERSION,
        dwconv_abi_version=DWCONV_ABI_VERSION,
    )

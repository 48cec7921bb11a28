"""The conv2d_activation family's kernels: lane + config + dtype -> a complete `.cu` source.

Two generations share one lane (and one C launcher, ``templates/_conv2d_abi.cu.j2``):

* ``dc...`` configs -> ``templates/conv2d_direct.cu.j2``: a direct conv for a few input channels (a frontend's first
  conv), parameterised by the config's tile (positions x channels), vector width and threads;
* ``b...`` (CUTLASS 2.x multistage) configs -> ``templates/sm80_conv2d_fprop.cu.j2``: CUTLASS's implicit-GEMM
  fprop (``DefaultConv2dFprop``, optimized strided iterators, NHWC/KRSC), bias + activation in its epilogue.
* ``t..._ws`` (CUTLASS 3.x) configs -> ``templates/sm90_conv2d_fprop.cu.j2``: the sm90 implicit-GEMM conv (TMA
  im2col, wgmma; collective builders), bias + activation as an EVT.
No emitter: the templates spell the kernel types from the config's tiles, cluster and stages.
"""
from __future__ import annotations

from ..configs import DC_MAX_K, Config, Lane
from .templates import ABI_VERSION

# Version of the conv2d family's launcher (`oasr_conv2d_*`), checked by the loader (families/conv2d_activation).
CONV2D_ABI_VERSION = 1
DIRECT_TEMPLATE = "conv2d_direct.cu.j2"
FPROP_TEMPLATE = "sm80_conv2d_fprop.cu.j2"
SM90_FPROP_TEMPLATE = "sm90_conv2d_fprop.cu.j2"
_SM90_SCHEDULES = {  # config schedule -> (CUTLASS conv kernel schedule, epilogue schedule)
    "warpspecialized": ("cutlass::conv::KernelImplicitTmaWarpSpecializedSm90", "cutlass::epilogue::TmaWarpSpecialized"),
}
_ELEMENT_DIRECT = {"fp16": "__half", "bf16": "__nv_bfloat16"}
_ELEMENT_CUTLASS = {"fp16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t"}
# int8 variants (op conv2d_int8_activation): int8 operands, the output's element named after the underscore; 3.x
# configs only (the sm90 implicit GEMM), with its own launcher `oasr_conv2d_int8_run`
INT8_VARIANTS = {"int8_fp16": "fp16", "int8_bf16": "bf16"}
# quantizing variants (op conv2d_activation_quant): operands of the element before the underscore, an int8 output
# (act(y) / out_scale, per tensor); direct (dc...) configs only, with their own launcher `oasr_conv2d_quant_run`
QUANT_VARIANTS = {"fp16_q8": "fp16", "bf16_q8": "bf16"}


def render_conv2d(lane: Lane, config: Config, dtype: str, env) -> str:
    """One conv2d kernel. Raises ValueError for a config outside the lane or a bad dtype."""
    int8, quant_out = dtype in INT8_VARIANTS, dtype in QUANT_VARIANTS
    if dtype not in _ELEMENT_DIRECT and not int8 and not quant_out:
        raise ValueError(f"conv2d dtype must be one of {(*_ELEMENT_DIRECT, *INT8_VARIANTS, *QUANT_VARIANTS)}, "
                         f"got {dtype!r}")
    if config not in lane.space:
        raise ValueError(f"config {config.id} is not in lane {lane.name}")
    if int8 and not (config.generation == "3x" and config.kernel_schedule in _SM90_SCHEDULES):
        raise ValueError(f"conv2d variant {dtype} needs an sm90 implicit-GEMM (t..._ws) config, got {config.id}")
    if quant_out and config.generation != "dc":
        raise ValueError(f"conv2d variant {dtype} needs a direct (dc...) config, got {config.id}")
    common = dict(lane=lane.name, config_id=config.id, dtype=dtype, abi_version=ABI_VERSION,
                  conv2d_abi_version=CONV2D_ABI_VERSION, int8=int8, quant_out=quant_out)
    if int8:
        dtype = INT8_VARIANTS[dtype]  # the output's element from here on
    if quant_out:
        dtype = QUANT_VARIANTS[dtype]  # the operands' element from here on
    if config.generation == "dc":
        p, tc, _ = config.tile
        groups = tc // config.alignment
        return env.get_template(DIRECT_TEMPLATE).render(
            **common, kernel_name=f"conv2d_direct_p{p}c{tc}v{config.alignment}n{config.threads}",
            element=_ELEMENT_DIRECT[dtype], tile_p=p, tile_c=tc, vec=config.alignment, threads=config.threads,
            rows=p // (config.threads // groups), max_k=DC_MAX_K)
    if config.generation == "2x":
        return env.get_template(FPROP_TEMPLATE).render(
            **common, kernel_name=f"cutlass_conv2d_fprop_{config.id}", element=_ELEMENT_CUTLASS[dtype],
            tile=list(config.tile), warp=list(config.warp), stages=config.stages, swizzle=4)
    if config.generation == "3x" and config.kernel_schedule in _SM90_SCHEDULES:
        kernel_sched, epi_sched = _SM90_SCHEDULES[config.kernel_schedule]
        return env.get_template(SM90_FPROP_TEMPLATE).render(
            **common, kernel_name=f"cutlass3x_conv2d_fprop_{config.id}", element=_ELEMENT_CUTLASS[dtype],
            tile=list(config.tile), cluster=list(config.cluster[:2]), stages=config.stages,
            schedule=config.kernel_schedule, kernel_schedule=kernel_sched, epilogue_schedule=epi_sched)
    raise ValueError(f"config {config.id} ({config.generation}) has no conv2d kernel")

"""fp8 e4m3 W8A8 scaled GEMM: Config -> cutlass_library operation object -> C++ kernel definition -> `.cu` source
(`render.render` dispatches here for lanes of family ``scaled_mm_fp8``).

Layout as for `nn.Linear`: activations e4m3 row-major M x K, W e4m3 N x K (a column-major K x N operand), D
row-major M x N, fp32 accumulation.

* 3.x (`sm90_fp8_wgmma`): cutlass_library's `EmitGemmUniversal3xInstance` with the template's row x column scale
  EVT (`OasrEVT`). FastAccum configs (``_fa``) take CUTLASS's ``*FP8FastAccum`` kernel schedules; the others the
  plain TMA warp-specialized ones, for which the collective builder picks the FP8 mainloop that promotes the wgmma
  accumulator into a full-fp32 one every ``mma_promotion_interval`` k-blocks (the template sets one per K tile).
  Swap-AB configs (``_swab``) describe the transposed problem ``D^T (N x M) = W (N x K) . A^T``: operand A is W
  (row-major N x K), operand B the activations (a column-major K x M operand: [M, K] with K contiguous, as
  before), and D column-major N x M (the same bytes as the row-major [M, N] output). The template swaps the
  broadcasts' roles (scale_w by the kernel's rows, scale_a by its columns) and the problem shape.
* 2.x (`sm89_fp8_mma`): `emit_int8.emit_visitor_kernel` (the 2.x EVT kernel) around an Sm89 e4m3 operation
  (m16n8k32 mma.sync, fp32 accumulation).

Kernel "dtype" = the output: ``fp16`` / ``bf16`` (op `scaled_mm_fp8`) or ``fp8`` (op `scaled_mm_fp8_quant`), or
``fp8_<act>`` (op `scaled_mm_fp8_act_quant`: GELU / SiLU between the bias and the e4m3 quantization, the fast-math
activation the int8 sm90 template has, `templates/_act_fast.cuh.j2`), or ``<fp16|bf16>_res`` (op
`scaled_mm_fp8_residual`: the residual read as the GEMM's C operand, ``out = residual + alpha * y``, as the int8
family's residual variant; data-parallel tiles). Both fused kinds are sm90 only: the sm89 2.x lane refuses them.
"""
from __future__ import annotations

from ..configs import Config
from ..paths import import_cutlass_library

import_cutlass_library()  # before any `from cutlass_library ...`: its generator would read our command line
from cutlass_library import library as L  # noqa: E402
from cutlass_library.gemm_operation import EmitGemmUniversal3xInstance, GemmOperation  # noqa: E402

from .act_math import ACT_MATH  # noqa: E402
from .emit import EmittedKernel, NamedEpilogue, sm90_schedules  # noqa: E402
from .emit_int8 import emit_visitor_kernel  # noqa: E402
from .templates import ABI_VERSION  # noqa: E402
from .templates import environment as _env  # noqa: E402
from .variants import FP8_ACT_VARIANTS as ACT_VARIANTS  # noqa: E402
from .variants import RESIDUAL_VARIANTS, SMM_ABI_VERSION, SMMR_ABI_VERSION  # noqa: E402

OUT_DTYPES = ("fp16", "bf16", "fp8")
VARIANTS = OUT_DTYPES + ACT_VARIANTS + RESIDUAL_VARIANTS
_D_TYPE = {"fp16": L.DataType.f16, "bf16": L.DataType.bf16, "fp8": L.DataType.e4m3}
_D_ALIGN = {"fp16": 8, "bf16": 8, "fp8": 16}  # 128-bit stores
_OPERAND_ALIGN = 16  # e4m3 elements per 128-bit load
ELEMENT_D = {"fp16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t", "fp8": "cutlass::float_e4m3_t"}
# The bias is added in fp32 before the one rounding: of the output dtype for fp16/bf16, fp32 for the quantizing op.
ELEMENT_BIAS = {"fp16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t", "fp8": "float"}
_FAST = {
    L.KernelScheduleType.TmaWarpSpecializedPingpong: L.KernelScheduleType.TmaWarpSpecializedPingpongFP8FastAccum,
    L.KernelScheduleType.TmaWarpSpecializedCooperative:
        L.KernelScheduleType.TmaWarpSpecializedCooperativeFP8FastAccum,
}


def _tensor(dtype: L.DataType, layout: L.LayoutType, align: int) -> L.TensorDescription:
    return L.TensorDescription(dtype, layout, align)


def _check(out_dtype: str) -> None:
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"scaled_mm_fp8 kernels output one of {OUT_DTYPES}, not {out_dtype!r}")


def sm90_operation(cfg: Config, out_dtype: str, epilogue_type: str = "OasrEVT",
                   residual: bool = False) -> GemmOperation:
    """`residual`: C is the residual stream (D's type and layout: column-major N x M for a swap-AB tile, the same
    bytes as the row-major [M, N] residual), read by the epilogue; else void."""
    _check(out_dtype)
    math = L.MathInstruction([64, cfg.tile[1], 32], L.DataType.e4m3, L.DataType.e4m3, L.DataType.f32,
                             L.OpcodeClass.TensorOp, L.MathOperation.multiply_add)
    tile = L.TileDescription(list(cfg.tile), cfg.stages, list(cfg.warp_count), math, 90, 90,
                             cluster_shape=list(cfg.cluster))
    kernel_sched, epi_sched, scheduler = sm90_schedules(cfg)
    if cfg.fast_accum:
        kernel_sched = _FAST[kernel_sched]
    d = _D_TYPE[out_dtype]
    d_layout = L.LayoutType.ColumnMajor if cfg.swap_ab else L.LayoutType.RowMajor
    return GemmOperation(
        L.GemmKind.Universal3x, 90, tile,
        _tensor(L.DataType.e4m3, L.LayoutType.RowMajor, _OPERAND_ALIGN),
        _tensor(L.DataType.e4m3, L.LayoutType.ColumnMajor, _OPERAND_ALIGN),
        # no C (scales/bias are EVT inputs), except for the residual variants: C = the residual, like D
        _tensor(d if residual else L.DataType.void, d_layout, _D_ALIGN[out_dtype]),
        L.DataType.f32,
        epilogue_functor=NamedEpilogue(epilogue_type),
        D=_tensor(d, d_layout, _D_ALIGN[out_dtype]),
        kernel_schedule=kernel_sched,
        epilogue_schedule=epi_sched,
        tile_scheduler=scheduler,
    )


def emit_sm90_fp8(cfg: Config, out_dtype: str, epilogue_type: str = "OasrEVT",
                  residual: bool = False) -> EmittedKernel:
    """A CUTLASS 3.x fp8 TMA warp-specialized GEMM whose fusion is the template's EVT `epilogue_type`."""
    op = sm90_operation(cfg, out_dtype, epilogue_type, residual)
    emitter = EmitGemmUniversal3xInstance()
    emitter.epilogue_functor = op.epilogue_functor  # cutlass_library 4.2 reads it from the emitter
    return EmittedKernel(op.procedural_name(), emitter.emit(op), tuple(emitter.includes))


def sm89_operation(cfg: Config, out_dtype: str, epilogue_type: str = "OasrEVT") -> GemmOperation:
    _check(out_dtype)
    math = L.MathInstruction([16, 8, 32], L.DataType.e4m3, L.DataType.e4m3, L.DataType.f32, L.OpcodeClass.TensorOp,
                             L.MathOperation.multiply_add)
    tile = L.TileDescription(list(cfg.tile), cfg.stages, list(cfg.warp_count), math, 89, 1024)
    return GemmOperation(
        L.GemmKind.Universal, 89, tile,
        _tensor(L.DataType.e4m3, L.LayoutType.RowMajor, _OPERAND_ALIGN),
        _tensor(L.DataType.e4m3, L.LayoutType.ColumnMajor, _OPERAND_ALIGN),
        _tensor(L.DataType.f32, L.LayoutType.RowMajor, 4),  # the EVT's fp32 fragments of 4 (C never read)
        L.DataType.f32,
        epilogue_functor=NamedEpilogue(epilogue_type),
        swizzling_functor=L.SwizzlingFunctor.Identity8,
        D=_tensor(_D_TYPE[out_dtype], L.LayoutType.RowMajor, 4),
    )


def promotion_interval(cfg: Config) -> int:
    """k-blocks (of 32) between promotions of the non-FastAccum accumulator: one K tile, a multiple of 4."""
    kb = cfg.tile[2] // 32
    return max(4, -(-kb // 4) * 4)


def render_scaled_mm_fp8(lane, config: Config, variant: str) -> str:
    """The full translation unit of one scaled_mm_fp8 kernel. `variant`: an output dtype, ``fp8_<act>`` (op
    scaled_mm_fp8_act_quant) or ``<fp16|bf16>_res`` (op scaled_mm_fp8_residual); both sm90 only, each a template
    branch of its own, so the other variants render byte-identically."""
    if variant not in VARIANTS:
        raise ValueError(f"dtype {variant!r} not supported by {lane.name} (variants {', '.join(VARIANTS)})")
    residual = variant in RESIDUAL_VARIANTS
    dtype, _, act = variant.partition("_")
    if residual:
        act = ""
    if config not in lane.space:
        raise ValueError(f"config {config.id} is not in lane {lane.name}")
    if dtype == "fp8" and config.kernel_schedule == "streamk":
        raise ValueError(f"{config.id}: there is no quantizing (fp8-output) Stream-K kernel")
    if act and config.generation != "3x":
        raise ValueError(f"{lane.name} has no activation epilogue: the {variant} variant (op scaled_mm_fp8_act_quant) "
                         "exists for the sm90 lane only")
    if residual and config.generation != "3x":
        raise ValueError(f"{lane.name}: no residual-epilogue variant ({variant}) in the 2.x lane; "
                         "oasr.scaled_mm_fp8_residual runs its torch composite there")
    if residual and config.kernel_schedule == "streamk":
        raise ValueError(f"{config.id}: there is no residual-epilogue Stream-K kernel (data-parallel tiles only)")
    if config.generation == "3x":
        emitted = emit_sm90_fp8(config, dtype, residual=residual)
    else:
        emitted = emit_visitor_kernel(sm89_operation(config, dtype), "OasrEVT")
    return _env().get_template(lane.template).render(
        lane=lane.name,
        config_id=config.id,
        dtype=variant,
        quant=dtype == "fp8",
        act=act,
        act_math=ACT_MATH,
        residual=residual,
        swap=config.swap_ab,
        fast_accum=config.fast_accum,
        swizzle=config.swizzle,
        promotion_interval=promotion_interval(config),
        element_d=ELEMENT_D[dtype],
        element_bias=ELEMENT_BIAS[dtype],
        tile=list(config.tile),
        warp=list(config.warp or (0, 0, 0)),
        includes=list(emitted.includes),
        definition=emitted.definition,
        operation_name=emitted.operation_name,
        abi_version=ABI_VERSION,
        smm_abi_version=SMM_ABI_VERSION,
        smmr_abi_version=SMMR_ABI_VERSION,
    )

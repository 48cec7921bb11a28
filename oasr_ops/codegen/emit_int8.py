"""int8 W8A8 scaled GEMM: Config -> cutlass_library operation object -> C++ kernel definition -> `.cu` source.

The scaled_mm family's counterpart of `emit.py` + `render.py` (which dispatches here for lanes of family
``scaled_mm``). Layout as for `nn.Linear`: A int8 row-major M x K (activations), W int8 N x K (a column-major
K x N operand), D row-major M x N; int32 accumulation.

* 3.x (`sm90_int8_wgmma`): the library's `EmitGemmUniversal3xInstance`, with the row x column scale EVT the
  template declares as `OasrEVT` (cutlass_library's emitter reads a custom epilogue from the emitter itself).
* 2.x (`sm80_int8_mma`): cutlass_library's 2.x emitter has no epilogue-visitor kernel, so the kernel definition
  is written here from the same operation object (its procedural name, tile, warp and instruction shapes and the
  library's type tags), in the form cutlass_cppgen emits for a 2.x EVT: `DefaultGemmWithVisitor`.

Kernel "dtype" of this family = the output: ``fp16`` / ``bf16`` (op `scaled_mm`) or ``int8`` (op
`scaled_mm_quant`, the output divided by out_scale, rounded half-to-even and saturated to int8), or a variant of
them: ``int8_<act>`` (op `scaled_mm_act_quant`, an fp32 bias), ``int8_<act>_<fp16|bf16>bias`` (the same op with
the bias of a 16-bit model read as it is: the broadcast converts it to fp32 exactly, so the result is bitwise the
fp32-bias variant's on ``bias.float()``, without a cast kernel per call) and ``<fp16|bf16>_res`` (op
`scaled_mm_residual`: the residual read as the GEMM's C operand, ``out = residual + alpha * y``; sm90 lane only,
data-parallel tiles only).
"""
from __future__ import annotations

from ..configs import Config
from ..paths import import_cutlass_library

import_cutlass_library()  # before any `from cutlass_library ...`: its generator would read our command line
from cutlass_library import library as L  # noqa: E402
from cutlass_library.gemm_operation import EmitGemmUniversal3xInstance, GemmOperation  # noqa: E402

from .act_math import ACT_MATH  # noqa: E402
from .emit import EmittedKernel, NamedEpilogue, sm90_schedules  # noqa: E402
from .templates import ABI_VERSION  # noqa: E402
from .templates import environment as _env  # noqa: E402
from .variants import ACT_BIAS_SUFFIX, RESIDUAL_VARIANTS, SMM_ABI_VERSION, SMMR_ABI_VERSION  # noqa: E402
from .variants import INT8_ACT_VARIANTS as ACT_VARIANTS  # noqa: E402

OUT_DTYPES = ("fp16", "bf16", "int8")
_ACT_BIAS_ELEMENT = {"": "float", "_fp16bias": "cutlass::half_t", "_bf16bias": "cutlass::bfloat16_t"}
assert tuple(_ACT_BIAS_ELEMENT) == tuple(ACT_BIAS_SUFFIX.values())
VARIANTS = OUT_DTYPES + ACT_VARIANTS + RESIDUAL_VARIANTS
_D_TYPE = {"fp16": L.DataType.f16, "bf16": L.DataType.bf16, "int8": L.DataType.s8}
_D_ALIGN = {"fp16": 8, "bf16": 8, "int8": 16}  # 128-bit stores
_OPERAND_ALIGN = 16  # int8 elements per 128-bit load
ELEMENT_D = {"fp16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t", "int8": "int8_t"}
# The bias is added in fp32 before the one rounding: of the output dtype for fp16/bf16, fp32 for the quantizing op.
ELEMENT_BIAS = {"fp16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t", "int8": "float"}


def _tensor(dtype: L.DataType, layout: L.LayoutType, align: int) -> L.TensorDescription:
    return L.TensorDescription(dtype, layout, align)


def _check(out_dtype: str) -> None:
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"scaled_mm kernels output one of {OUT_DTYPES}, not {out_dtype!r}")


def sm90_operation(cfg: Config, out_dtype: str, epilogue_type: str = "OasrEVT",
                   residual: bool = False) -> GemmOperation:
    """`residual`: C is the residual stream (D's type and layout, read by TMA in the epilogue), else void."""
    _check(out_dtype)
    math = L.MathInstruction([64, cfg.tile[1], 32], L.DataType.s8, L.DataType.s8, L.DataType.s32,
                             L.OpcodeClass.TensorOp, L.MathOperation.multiply_add)
    tile = L.TileDescription(list(cfg.tile), cfg.stages, list(cfg.warp_count), math, 90, 90,
                             cluster_shape=list(cfg.cluster))
    kernel_sched, epi_sched, scheduler = sm90_schedules(cfg)
    d = _D_TYPE[out_dtype]
    return GemmOperation(
        L.GemmKind.Universal3x, 90, tile,
        _tensor(L.DataType.s8, L.LayoutType.RowMajor, _OPERAND_ALIGN),
        _tensor(L.DataType.s8, L.LayoutType.ColumnMajor, _OPERAND_ALIGN),
        # no C (scales/bias are EVT inputs), except for the residual variants: C = the residual, like D
        _tensor(d if residual else L.DataType.void, L.LayoutType.RowMajor, _D_ALIGN[out_dtype]),
        L.DataType.f32,
        epilogue_functor=NamedEpilogue(epilogue_type),
        D=_tensor(d, L.LayoutType.RowMajor, _D_ALIGN[out_dtype]),
        kernel_schedule=kernel_sched,
        epilogue_schedule=epi_sched,
        tile_scheduler=scheduler,
    )


def emit_sm90_int8(cfg: Config, out_dtype: str, epilogue_type: str = "OasrEVT",
                   residual: bool = False) -> EmittedKernel:
    """A CUTLASS 3.x int8 TMA warp-specialized GEMM whose fusion is the template's EVT `epilogue_type`."""
    op = sm90_operation(cfg, out_dtype, epilogue_type, residual)
    emitter = EmitGemmUniversal3xInstance()
    emitter.epilogue_functor = op.epilogue_functor  # cutlass_library 4.2 reads it from the emitter
    return EmittedKernel(op.procedural_name(), emitter.emit(op), tuple(emitter.includes))


def sm80_operation(cfg: Config, out_dtype: str, epilogue_type: str = "OasrEVT") -> GemmOperation:
    _check(out_dtype)
    math = L.MathInstruction([16, 8, 32], L.DataType.s8, L.DataType.s8, L.DataType.s32, L.OpcodeClass.TensorOp,
                             L.MathOperation.multiply_add_saturate)
    tile = L.TileDescription(list(cfg.tile), cfg.stages, list(cfg.warp_count), math, 80, 1024)
    d = _D_TYPE[out_dtype]
    return GemmOperation(
        L.GemmKind.Universal, 80, tile,
        _tensor(L.DataType.s8, L.LayoutType.RowMajor, _OPERAND_ALIGN),
        _tensor(L.DataType.s8, L.LayoutType.ColumnMajor, _OPERAND_ALIGN),
        # The epilogue's thread map works on fp32 fragments of 4 (as vLLM's c2x kernels): scales load as float4,
        # D is stored 4 elements at a time by the EVT's VisitorAuxStore. C is never read.
        _tensor(L.DataType.f32, L.LayoutType.RowMajor, 4),
        L.DataType.f32,
        epilogue_functor=NamedEpilogue(epilogue_type),
        swizzling_functor=L.SwizzlingFunctor.Identity8,
        D=_tensor(d, L.LayoutType.RowMajor, 4),
    )


_SM80_VISITOR_KERNEL = """
// Gemm operator {name} (2.x epilogue visitor tree; the problem is described directly, row-major D)
using {name}_base =
  typename cutlass::gemm::kernel::DefaultGemmWithVisitor<
    {ea}, {la}, cutlass::ComplexTransform::kNone, {aa},
    {eb}, {lb}, cutlass::ComplexTransform::kNone, {ab},
    {ec}, {lc}, {ac},
    {eacc},
    {eepi},
    {opclass},
    cutlass::arch::Sm{arch},
    cutlass::gemm::GemmShape<{tm}, {tn}, {tk}>,
    cutlass::gemm::GemmShape<{wm}, {wn}, {wk}>,
    cutlass::gemm::GemmShape<{im}, {in_}, {ik}>,
    {callbacks},
    {swizzle},
    {stages},
    {mathop},
    1 /* epilogue stages */
>::GemmKernel;

// Define named type
struct {name} : public {name}_base {{ }};
"""


def emit_sm80_int8(cfg: Config, out_dtype: str, epilogue_type: str = "OasrEVT") -> EmittedKernel:
    """A CUTLASS 2.x multistage int8 GEMM around the template's 2.x EVT `epilogue_type`."""
    return emit_visitor_kernel(sm80_operation(cfg, out_dtype, epilogue_type), epilogue_type)


def emit_visitor_kernel(op: GemmOperation, epilogue_type: str) -> EmittedKernel:
    """The 2.x EVT kernel definition (`DefaultGemmWithVisitor`) of a 2.x operation object (int8 and fp8 lanes)."""
    td = op.tile_description
    warp = [td.threadblock_shape[i] // td.warp_count[i] for i in range(3)]
    name = op.procedural_name()
    definition = _SM80_VISITOR_KERNEL.format(
        name=name,
        ea=L.DataTypeTag[op.A.element], la=L.LayoutTag[op.A.layout], aa=op.A.alignment,
        eb=L.DataTypeTag[op.B.element], lb=L.LayoutTag[op.B.layout], ab=op.B.alignment,
        ec=L.DataTypeTag[op.C.element], lc=L.LayoutTag[op.C.layout], ac=op.C.alignment,
        eacc=L.DataTypeTag[op.accumulator_type()], eepi=L.DataTypeTag[op.element_epilogue],
        opclass=L.OpcodeClassTag[td.math_instruction.opcode_class], arch=op.arch,
        tm=td.threadblock_shape[0], tn=td.threadblock_shape[1], tk=td.threadblock_shape[2],
        wm=warp[0], wn=warp[1], wk=warp[2],
        im=td.math_instruction.instruction_shape[0], in_=td.math_instruction.instruction_shape[1],
        ik=td.math_instruction.instruction_shape[2],
        callbacks=epilogue_type,
        swizzle=L.SwizzlingFunctorTag[op.swizzling_functor],
        stages=td.stages,
        mathop=L.MathOperationTag[td.math_instruction.math_operation],
    )
    includes = (
        "cutlass/cutlass.h",
        "cutlass/gemm/device/gemm_universal_adapter.h",
        "cutlass/epilogue/threadblock/fusion/visitors.hpp",
        "cutlass/gemm/kernel/default_gemm_universal_with_visitor.h",
    )
    return EmittedKernel(name, definition, includes)


def render_scaled_mm(lane, config: Config, variant: str) -> str:
    """The full translation unit of one scaled_mm kernel (`render.render` dispatches here by lane family).
    `variant`: an output dtype, ``int8_<act>[_<fp16|bf16>bias]`` (activation, then quantization) or
    ``<fp16|bf16>_res`` (residual add); each variant is a branch of the template of its own, the plain variants
    render byte-identically."""
    if variant not in VARIANTS:
        raise ValueError(f"dtype {variant!r} not supported by {lane.name} (variants {', '.join(VARIANTS)})")
    residual = variant in RESIDUAL_VARIANTS
    dtype, _, act = variant.partition("_")
    element_bias = ELEMENT_BIAS[dtype]
    if residual:
        act = ""
    elif act:
        act, _, bias = act.partition("_")
        element_bias = _ACT_BIAS_ELEMENT[f"_{bias}" if bias else ""]
    if config not in lane.space:
        raise ValueError(f"config {config.id} is not in lane {lane.name}")
    if dtype == "int8" and config.kernel_schedule == "streamk":
        raise ValueError(f"{config.id}: there is no quantizing (int8-output) Stream-K kernel")
    if residual and config.generation != "3x":
        raise ValueError(f"{lane.name}: no residual-epilogue variant ({variant}) in the 2.x lane; "
                         "oasr.scaled_mm_residual runs its torch composite there")
    if residual and config.kernel_schedule == "streamk":
        raise ValueError(f"{config.id}: there is no residual-epilogue Stream-K kernel (data-parallel tiles only)")
    if config.generation == "3x":
        emitted = emit_sm90_int8(config, dtype, residual=residual)
    else:
        emitted = emit_sm80_int8(config, dtype)
    return _env().get_template(lane.template).render(
        lane=lane.name,
        config_id=config.id,
        dtype=variant,
        quant=dtype == "int8",
        act=act,
        act_math=ACT_MATH,
        residual=residual,
        element_d=ELEMENT_D[dtype],
        element_bias=element_bias,
        tile=list(config.tile),
        warp=list(config.warp or (0, 0, 0)),
        d_align=_D_ALIGN[dtype],
        includes=list(emitted.includes),
        definition=emitted.definition,
        operation_name=emitted.operation_name,
        abi_version=ABI_VERSION,
        smm_abi_version=SMM_ABI_VERSION,
        smmr_abi_version=SMMR_ABI_VERSION,
    )

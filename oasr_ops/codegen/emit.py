"""Config -> cutlass_library operation object -> the library's own emitter -> a CUTLASS type definition.

Only the operation description lives here; the launcher around it is the lane's Jinja template. Both JIT
builds and `oasr tune prebuild` call `render()` (render.py), which calls these functions.

Layout: A is row-major M×K (activations), W is N×K as stored by `nn.Linear` (a column-major K×N operand), D is
row-major M×N: CUTLASS's "tnt" GEMM.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..configs import Config
from ..paths import import_cutlass_library

import_cutlass_library()
from cutlass_library import library as L  # noqa: E402
from cutlass_library.gemm_operation import (  # noqa: E402
    EmitGemmUniversal3xInstance,
    EmitGemmUniversalInstance,
    GemmOperation,
)

DTYPES = {"fp16": L.DataType.f16, "bf16": L.DataType.bf16}


@dataclass(frozen=True)
class NamedEpilogue:
    """A user-defined epilogue for the emitters: they only ask for the C++ type name (declared by the template)."""

    type_name: str

    def emit_declaration(self) -> str:
        return self.type_name


@dataclass(frozen=True)
class EmittedKernel:
    operation_name: str  # the CUTLASS kernel struct the emitter defined
    definition: str  # C++ source defining it
    includes: tuple[str, ...]


def _tensor(dtype: L.DataType, layout: L.LayoutType, align: int) -> L.TensorDescription:
    return L.TensorDescription(dtype, layout, align)


def sm90_schedules(cfg: Config):
    """(kernel schedule, epilogue schedule, tile scheduler) of a 3.x config, as cutlass_library enums."""
    kernel_sched = {
        "cooperative": L.KernelScheduleType.TmaWarpSpecializedCooperative,
        "streamk": L.KernelScheduleType.TmaWarpSpecializedCooperative,
        "pingpong": L.KernelScheduleType.TmaWarpSpecializedPingpong,
    }[cfg.kernel_schedule]
    epi_sched = {
        "tma_cooperative": L.EpilogueScheduleType.TmaWarpSpecializedCooperative,
        "tma": L.EpilogueScheduleType.TmaWarpSpecialized,
    }[cfg.epilogue_schedule]
    scheduler = L.TileSchedulerType.StreamK if cfg.kernel_schedule == "streamk" else L.TileSchedulerType.Persistent
    return kernel_sched, epi_sched, scheduler


def emit_sm90(cfg: Config, dtype: str, epilogue_type: str, b_layout: L.LayoutType = L.LayoutType.ColumnMajor
              ) -> EmittedKernel:
    """A CUTLASS 3.x TMA warp-specialized GEMM whose fusion is the template's EVT `epilogue_type`.

    `b_layout`: ColumnMajor is W as `nn.Linear` stores it ([N, K], K contiguous); RowMajor is a [K, N] operand
    with N contiguous (the bmm family's `attn @ v`)."""
    el = DTYPES[dtype]
    math = L.MathInstruction([64, cfg.tile[1], 16], el, el, L.DataType.f32, L.OpcodeClass.TensorOp,
                             L.MathOperation.multiply_add)
    tile = L.TileDescription(list(cfg.tile), cfg.stages, list(cfg.warp_count), math, 90, 90,
                             cluster_shape=list(cfg.cluster))
    kernel_sched, epi_sched, scheduler = sm90_schedules(cfg)
    epilogue = NamedEpilogue(epilogue_type)
    op = GemmOperation(
        L.GemmKind.Universal3x, 90, tile,
        _tensor(el, L.LayoutType.RowMajor, cfg.alignment),
        _tensor(el, b_layout, cfg.alignment),
        _tensor(L.DataType.void, L.LayoutType.RowMajor, cfg.alignment),  # no C operand: bias is an EVT input
        L.DataType.f32,
        epilogue_functor=epilogue,
        D=_tensor(el, L.LayoutType.RowMajor, cfg.alignment),
        kernel_schedule=kernel_sched,
        epilogue_schedule=epi_sched,
        tile_scheduler=scheduler,
    )
    emitter = EmitGemmUniversal3xInstance()
    # cutlass_library 4.2 reads a custom epilogue from the emitter, not the operation.
    emitter.epilogue_functor = epilogue
    name = op.procedural_name()
    return EmittedKernel(name, emitter.emit(op), tuple(emitter.includes))


def emit_sm80(cfg: Config, dtype: str, epilogue_type: str) -> EmittedKernel:
    """A CUTLASS 2.x multistage GEMM (mma.sync m16n8k16) with the template's output op `epilogue_type`."""
    el = DTYPES[dtype]
    math = L.MathInstruction([16, 8, 16], el, el, L.DataType.f32, L.OpcodeClass.TensorOp,
                             L.MathOperation.multiply_add)
    tile = L.TileDescription(list(cfg.tile), cfg.stages, list(cfg.warp_count), math, 80, 1024)
    epilogue = NamedEpilogue(epilogue_type)
    # Described as the profiler describes it: the column-major problem D^T (N x M) = W (N x K, row-major) x A^T
    # (K x M, column-major). The 2.x emitter transposes it into a kernel over the row-major problem, and
    # GemmUniversalAdapter transposes the launch arguments the same way (its kInternalTranspose).
    op = GemmOperation(
        L.GemmKind.Universal, 80, tile,
        _tensor(el, L.LayoutType.RowMajor, cfg.alignment),
        _tensor(el, L.LayoutType.ColumnMajor, cfg.alignment),
        _tensor(el, L.LayoutType.ColumnMajor, cfg.alignment),
        L.DataType.f32,
        epilogue_functor=epilogue,
        swizzling_functor=L.SwizzlingFunctor.Identity8,
    )
    emitter = EmitGemmUniversalInstance()
    emitter.epilogue_functor = epilogue
    name = op.procedural_name()
    return EmittedKernel(name, emitter.emit(op), tuple(emitter.includes))

"""The batched GEMM family: `oasr::bmm(Tensor a, Tensor b, str config) -> Tensor`.

``out[l] = a[l] @ b[l]`` for a ``[L, M, K]`` and b ``[L, K, N]`` (fp16/bf16, same dtype and device), out
``[L, M, N]`` contiguous in a's dtype: fp32 accumulation, one rounding (the kernels' and the CPU reference's
formula). This is `torch.bmm`; the backend rewrites `aten.bmm` (what `torch.matmul` of attention scores and
`attn @ v` lower to) into it.

Layouts. a must have K contiguous; b either K contiguous (``k.transpose(-1, -2)``: op ``bmm``, kernel variant
``_bk``) or N contiguous (row-major ``v``: op ``bmm_nn``, variant ``_bn``). Leading and batch strides are passed to
the kernel, so views run without a copy when TMA can address them: every non-unit stride a multiple of 8 elements
(16 bytes), K % 8 == 0 and N % 8 == 0, 16-byte aligned base pointers, no broadcast (stride-0) batch. Any other
call is served by `torch.bmm` (one warning per signature) — never a wrong result.

Selection. `config` is a concrete id of the native bmm lane (lanes/sm90_f16_bmm.py), a sentinel, `auto` or a
baked region table. `auto` walks the tuning DB's ``bmm`` family (``bmm|op=bmm|dt=half|N=..|K=..``, a file
``bmm.json`` beside ``gemm.json``) with the row count ``L * M`` on the M axis (the number of output tiles, which is
what the tile choice depends on, scales with L * M). Without an entry the family falls back to ``torch``
(cuBLAS), not to a CUTLASS default: nothing has measured a CUTLASS bmm tile against cuBLAS for that shape, so
an untuned bmm must not get slower than aten (decision, docs/kernels.md). `default` names the lane default.
No bmm lane runs on pre-Hopper GPUs: there every config is served by torch, with one warning for a concrete id.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from ..autograd import register_inference_op
from ...codegen.jit import KernelCache, KernelLibrary, load_launcher
from ...configs import Config
from ...runtime import database as _database
from ...runtime import select as _select
from ...runtime.arch import current_arch_family
from ...runtime.plans import Plan, PlanCache, WarnOnce, make_plan
from ...runtime.plans import check_config_arg as _check_config_arg
from ...runtime.plans import lane_check

FAMILY = "bmm"
DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
ALIGN_ELEMS = 8  # 16 bytes of fp16/bf16: TMA's stride and vector granularity
OP_FOR_MAJOR = {"k": "bmm", "n": "bmm_nn"}

_lib = torch.library.Library("oasr", "FRAGMENT")
_lib.define("bmm(Tensor a, Tensor b, str config) -> Tensor", tags=(torch.Tag.needs_fixed_stride_order,))


# ----------------------------------------------------------------------------------------------------------
# checks and layout

def _check(a, b) -> None:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise ValueError("oasr.bmm: a and b must be tensors")
    if a.dtype not in DTYPES:
        raise ValueError(f"oasr.bmm: a has dtype {a.dtype}; supported: float16, bfloat16")
    if b.dtype != a.dtype:
        raise ValueError(f"oasr.bmm: b has dtype {b.dtype} but a has {a.dtype}")
    if a.dim() != 3 or b.dim() != 3:
        raise ValueError(f"oasr.bmm: a and b must be 3-D [L, M, K] and [L, K, N], got shapes {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"oasr.bmm: batch mismatch: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    if a.shape[2] != b.shape[1]:
        raise ValueError(f"oasr.bmm: K mismatch: a is {tuple(a.shape)}, b is {tuple(b.shape)} (b is [L, K, N])")
    if a.device != b.device:
        raise ValueError(f"oasr.bmm: a is on {a.device}, b on {b.device}")


_IN_A_LANE = lane_check(FAMILY)  # check_config_arg's check_id: one function object (its memo key)


def check_config_arg(config: str) -> None:
    """ValueError unless `config` is auto, a sentinel, a bmm lane's config id or a region table of those (the same
    rule on CPU and CUDA and in the fake, whatever the GPU)."""
    _check_config_arg(config, FAMILY, _IN_A_LANE)


def b_major(b: torch.Tensor) -> str:
    """Which of b's two GEMM dims is contiguous: "n" (row-major [.., K, N]) or "k" (a transposed [.., N, K])."""
    n, k = b.shape[-1], b.shape[-2]
    if b.stride(-1) == 1 or n == 1:
        return "n"
    if b.stride(-2) == 1 or k == 1:
        return "k"
    return "n"  # neither: not addressable, `tma_layout` says so


def op_name(b: torch.Tensor) -> str:
    return OP_FOR_MAJOR[b_major(b)]


@dataclass(frozen=True)
class TmaLayout:
    """The strides (elements) the kernel is launched with, or why it cannot be."""

    b_major: str
    lda: int = 0
    batch_a: int = 0
    ldb: int = 0
    batch_b: int = 0
    why_not: str | None = None


def tma_layout(a: torch.Tensor, b: torch.Tensor) -> TmaLayout:
    """The kernel's view of (a, b), checked against what TMA can address (module docstring)."""
    el, m, k = a.shape
    n = b.shape[2]
    major = b_major(b)
    if k % ALIGN_ELEMS or n % ALIGN_ELEMS:
        return TmaLayout(major, why_not=f"K={k} and N={n} must be multiples of {ALIGN_ELEMS}")
    if a.stride(2) != 1 and k > 1:
        return TmaLayout(major, why_not=f"a's K dim is not contiguous (stride {a.stride()})")
    if major == "n":
        if b.stride(2) != 1 and n > 1:
            return TmaLayout(major, why_not=f"neither of b's GEMM dims is contiguous (stride {b.stride()})")
        ldb = b.stride(1) if k > 1 else n
    else:
        ldb = b.stride(2) if n > 1 else k
    lda = a.stride(1) if m > 1 else k
    batch_a, batch_b = a.stride(0), b.stride(0)
    if el == 1:  # the batch stride is never used: describe a packed problem
        batch_a, batch_b = lda * m, ldb * (k if major == "n" else n)
    for name, s, lo in (("a's row stride", lda, k), ("b's row stride", ldb, n if major == "n" else k),
                        ("a's batch stride", batch_a, 1), ("b's batch stride", batch_b, 1)):
        if s < lo or s % ALIGN_ELEMS:
            return TmaLayout(major, why_not=f"{name} {s} is not a multiple of {ALIGN_ELEMS} that is >= {lo}")
    return TmaLayout(major, lda, batch_a, ldb, batch_b)


# ----------------------------------------------------------------------------------------------------------
# reference (CPU) and fake

def reference_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp32 accumulation, one rounding to a's dtype."""
    return torch.bmm(a.float(), b.float()).to(a.dtype)


def _bmm_cpu(a, b, config):
    _check(a, b)
    check_config_arg(config)
    return reference_bmm(a, b)


def _bmm_fake(a, b, config):
    _check(a, b)
    check_config_arg(config)
    return a.new_empty((a.shape[0], a.shape[1], b.shape[2]))


# ----------------------------------------------------------------------------------------------------------
# kernels

_KERNELS = KernelCache()


def get_kernel(lane, config: Config, variant: str, arch: str) -> KernelLibrary:
    """Build (JIT, first use) and load one bmm kernel. Raises BuildError / LoadError (remembered)."""
    from ...codegen.jit import JitSpec

    return _KERNELS.get((lane.name, config.id, variant, arch),
                        lambda: load_kernel(JitSpec.for_kernel(lane, config, variant, arch)))


def load_kernel(spec) -> KernelLibrary:
    """The bmm launcher (``oasr_bmm_*``: L, M, N, K and the leading/batch strides) of a built kernel."""
    from ...codegen.render import BMM_ABI_VERSION

    p, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    shape = [i, i, i, i, ll, ll, ll, ll]
    return load_launcher(spec, "bmm", BMM_ABI_VERSION, [p, p, p, *shape, p, ctypes.c_size_t, p], shape)


def native_lane(arch: str):
    from ...runtime.registry import native_lane as _native

    return _native(arch, FAMILY)


# ----------------------------------------------------------------------------------------------------------
# CUDA

_PLANS = PlanCache()
_plans = _PLANS.plans
_warn_once = WarnOnce()


def _torch_run(a, b):
    return torch.bmm(a, b)


def signature(dtype: torch.dtype, major: str, n: int, k: int) -> str:
    return _database.signature(FAMILY, OP_FOR_MAJOR[major], "half", n, k)


def _kernel_run(cfg: Config, dtype: torch.dtype, el: int, m: int, n: int, k: int, lay: TmaLayout, arch: str,
                sig: str):
    from ...codegen.jit import BuildError, LoadError
    from ...codegen.render import kernel_variant

    lane = native_lane(arch)
    if lane is None:
        _warn_once(f"oasr.bmm: no bmm kernel lane runs on {arch}; torch.bmm serves {cfg.id}")
        return None
    if cfg not in lane.space:
        raise ValueError(f"oasr.bmm: config {cfg.id} is not in lane {lane.name}'s space {list(lane.ids())}")
    if lay.why_not:
        _warn_once(f"oasr.bmm: {sig} (L={el}, M={m}) cannot use a CUTLASS kernel: {lay.why_not}; "
                   "torch.bmm serves such calls")
        return None
    variant = kernel_variant(DTYPES[dtype], lay.b_major)
    try:
        kern = get_kernel(lane, cfg, variant, arch)
    except (BuildError, LoadError) as e:
        _warn_once(f"oasr.bmm: kernel {cfg.id} ({variant}) unavailable, using torch: {e}")
        return None
    shape = (el, m, n, k, lay.lda, lay.batch_a, lay.ldb, lay.batch_b)
    status = kern.can_implement(*shape)
    if status != 0:
        _warn_once(f"oasr.bmm: {cfg.id} rejects {sig} L={el} M={m} (CUTLASS status {status}); using torch")
        return None
    ws_bytes = int(kern.workspace_size(*shape))
    run_c = kern.run
    raw_stream = torch._C._cuda_getCurrentRawStream

    def run_kernel(a, b):
        if a.data_ptr() % 16 or b.data_ptr() % 16:
            _warn_once(f"oasr.bmm: an operand of {sig} is not 16-byte aligned; torch.bmm serves such calls")
            return torch.bmm(a, b)
        out = torch.empty((el, m, n), dtype=a.dtype, device=a.device)
        ws = torch.empty(ws_bytes, dtype=torch.uint8, device=a.device) if ws_bytes else None
        rc = run_c(a.data_ptr(), b.data_ptr(), out.data_ptr(), *shape, None if ws is None else ws.data_ptr(),
                   ws_bytes, raw_stream(a.get_device()))
        if rc != 0:
            raise RuntimeError(f"oasr.bmm: kernel {cfg.id} failed with status {rc} on L={el} M={m} N={n} K={k}")
        return out
    return run_kernel


def select_config(dtype: torch.dtype, major: str, n: int, k: int, rows: int, arch: str | None = None):
    """`runtime.select.select_config` for a bmm with `rows` = L * M on the M axis (untuned: `torch`)."""
    return _select.select_config(FAMILY, OP_FOR_MAJOR[major], DTYPES.get(dtype, dtype), n, k, rows, arch)


def _make_plan(config: str, a: torch.Tensor, b: torch.Tensor) -> Plan:
    el, m, k = a.shape
    n = b.shape[2]
    lay = tma_layout(a, b)
    sig = signature(a.dtype, lay.b_major, n, k)
    arch = current_arch_family() or "sm80"
    return make_plan(FAMILY, config, el * m, n, k, arch, sig,
                     select=lambda: select_config(a.dtype, lay.b_major, n, k, el * m, arch),
                     torch_run=lambda _sentinel: _torch_run,
                     kernel_run=lambda cfg: _kernel_run(cfg, a.dtype, el, m, n, k, lay, arch, sig))


def _bmm_cuda(a, b, config):
    key = (config, a.dtype, b.dtype, a.shape, b.shape, a.stride(), b.stride(), a.device, b.device,
           _database.epoch())
    plan = _plans.get(key)
    if plan is None:
        _check(a, b)
        check_config_arg(config)
        if a.numel() == 0 or b.numel() == 0:  # nothing to launch: zeros (K = 0) or an empty output
            return torch.bmm(a, b)
        plan = _PLANS.get_or_make(key, lambda: _make_plan(config, a, b))
    plan.calls += 1
    return plan.run(a, b)


register_inference_op(_lib, "bmm", cpu=_bmm_cpu, cuda=_bmm_cuda, fake=_bmm_fake)

served = _PLANS.served
reset_plans = _PLANS.clear


def bmm(a: torch.Tensor, b: torch.Tensor, config: str = "auto") -> torch.Tensor:
    """`torch.bmm(a, b)` on the kernel `config` names (`auto`: the tuning DB's bmm family, else torch)."""
    return torch.ops.oasr.bmm.default(a, b, config)

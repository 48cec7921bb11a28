"""The layer_norm_quant kernels: JIT build (shared cache and trust rules) and the ``oasr_lnq_*`` launcher."""
from __future__ import annotations

import ctypes

import torch

from ...codegen.jit import BuildError, KernelCache, KernelLibrary, LoadError, load_launcher
from ...codegen.render_layer_norm_quant import LNQ_ABI_VERSION, LnqConfig, LnqSpec, lnq_variant
from ...runtime.plans import WarnOnce

_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_KERNELS = KernelCache()
_warn_once = WarnOnce()


def cuda_arch_of(device: torch.device) -> str:
    """nvcc target of the GPU: sm_90 builds as 90a (the H200), others as their own major/minor."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


def spec_for(config: LnqConfig, dtype: torch.dtype, scheme: str, cuda_arch: str) -> LnqSpec:
    return LnqSpec.make(config, lnq_variant(_NAMES[dtype], scheme), cuda_arch)


def load_kernel(spec: LnqSpec) -> KernelLibrary:
    """``oasr_lnq_run(x, w, w_f32, b, b_f32, q, scale, y, M, N, eps, stream)``; shape queries take (M, N)."""
    p, i = ctypes.c_void_p, ctypes.c_int
    return load_launcher(spec, "lnq", LNQ_ABI_VERSION, [p, p, i, p, i, p, p, p, i, i, ctypes.c_float, p], [i, i],
                         shape_names=["M", "N"])


def get_kernel(config: LnqConfig, dtype: torch.dtype, scheme: str, device: torch.device) -> KernelLibrary | None:
    """The built kernel, or None (warned once) when it cannot be built or loaded: the caller runs the reference."""
    arch = cuda_arch_of(device)
    spec = spec_for(config, dtype, scheme, arch)
    try:
        return _KERNELS.get((config.id, spec.dtype, arch), lambda: load_kernel(spec))
    except (BuildError, LoadError) as e:
        _warn_once(f"oasr.layer_norm_quant: kernel {spec.name} unavailable, using the reference: {e}")
        return None

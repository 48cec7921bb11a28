"""The ops are inference kernels: no backward. Registering that as their autograd formula turns torch's generic
"no autograd kernel registered" warning into one clear error, raised only if a backward actually reaches the op
(a forward with tensors that require grad still runs; a compiled graph's backward comes from the aten graph
before the oasr pass rewrote it, so training through `torch.compile(backend="oasr")` is unaffected).

Why not `torch.library.register_autograd` alone: its Autograd kernel runs on every call, grad or not, and costs
three Python frames, a dataclass and an out-variant check before the redispatch — measured on the H200 at about
2 ms per forward of an int8 Conformer M without CUDA graphs (130 op calls; docs/perf/e2e.md, "Session 11"). The
kernel registered here does the no-grad case in one frame (grad mode and `_any_requires_grad`, both C++, then the
redispatch below autograd) and hands the grad case to the kernel `register_autograd` builds, so the error and
its message are torch's mechanism, unchanged."""
from __future__ import annotations

from typing import Any

import torch
from torch._library.autograd import Info, make_autograd_impl

_C = torch._C


def inference_only(qualname: str, lib: Any) -> None:
    """Register an Autograd kernel for `qualname` ("oasr::gemm") whose backward raises a RuntimeError naming the
    op, and whose no-grad path is one redispatch."""
    name = qualname.replace("::", ".")

    def backward(ctx: Any, *grads: Any) -> Any:
        raise RuntimeError(f"{name} has no backward (an inference kernel): run it under torch.no_grad() or "
                           "torch.inference_mode(), or use the aten op it replaces where gradients are needed")

    op = torch._library.utils.lookup_op(qualname)
    with_grad = make_autograd_impl(op, Info(backward, None))  # the Function whose backward raises
    redispatch = op._handle.redispatch_boxed
    below = _C._after_autograd_keyset
    is_grad_enabled, any_requires_grad, below_autograd = _C.is_grad_enabled, _C._any_requires_grad, \
        _C._AutoDispatchBelowAutograd

    def autograd_kernel(keyset: Any, *args: Any) -> Any:
        if is_grad_enabled() and any_requires_grad(*args):
            return with_grad(keyset, *args)
        with below_autograd():
            return redispatch(keyset & below, *args)

    lib.impl(qualname.split("::", 1)[1], autograd_kernel, "Autograd", with_keyset=True)

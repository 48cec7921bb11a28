"""The ops are inference kernels: no backward. Registering that as their autograd formula turns torch's generic
"no autograd kernel registered" warning into one clear error, raised only if a backward actually reaches the op
(a forward with tensors that require grad still runs; a compiled graph's backward comes from the aten graph
before the oasr pass rewrote it, so training through `torch.compile(backend="oasr")` is unaffected)."""
from __future__ import annotations

from typing import Any

import torch


def inference_only(qualname: str, lib: Any) -> None:
    """Register a backward for `qualname` ("oasr::gemm") that raises a RuntimeError naming the op."""
    name = qualname.replace("::", ".")

    def backward(ctx: Any, *grads: Any) -> Any:
        raise RuntimeError(f"{name} has no backward (an inference kernel): run it under torch.no_grad() or "
                           "torch.inference_mode(), or use the aten op it replaces where gradients are needed")

    torch.library.register_autograd(qualname, backward, lib=lib)

"""The ops are inference kernels: no backward. Registering that as their autograd formula turns torch's generic
"no autograd kernel registered" warning into one clear error, raised only if a backward actually reaches the op
(a forward with tensors that require grad still runs, eager or compiled: the backward is `oasr::no_backward`, which
raises only when it runs, so AOTAutograd can trace it when a graph holding the op is compiled with grad on; a compiled
graph's backward otherwise comes from the aten graph before the oasr pass rewrote it, so training through
`torch.compile(backend="oasr")` is unaffected).

Why not `torch.library.register_autograd` alone: its Autograd kernel runs on every call, grad or not, and costs
three Python frames, a dataclass and an out-variant check before the redispatch — about 2 ms per forward of an
int8 Conformer M without CUDA graphs on the H200's host (130 op calls; session 11's host profile, whose raw file
was lost; docs/perf/e2e.md, "Serving traffic without CUDA graphs", has the per-op A/B measured since).
The kernel registered here does the no-grad case in one frame (grad mode and `_any_requires_grad`, both C++) and
hands the grad case to the kernel `register_autograd` builds, so the error and its message are torch's mechanism.

The no-grad case then calls the backend implementation itself when nothing sits between autograd and the backend
kernel — the call's keys below ADInplaceOrView (a fallthrough for these ops) are exactly one backend, CPU or CUDA,
with a kernel registered here — instead of a redispatch (a second C++ -> Python crossing with the arguments boxed
again, plus the below-autograd guard: ~4 us of ~11 per call on a 2-core host, benchmarks/host_overhead.py). Any
other key there (Python: FakeTensor, a TorchDispatchMode; Functionalize; a backend without a kernel here) takes the
redispatch, so tracing and modes see the op exactly as before. Under `torch.inference_mode()` the autograd keys are
skipped by the dispatcher and this kernel does not run at all."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch._library.autograd import Info, make_autograd_impl

_C = torch._C
_BACKEND_KEYS = {"CPU": _C.DispatchKey.CPU, "CUDA": _C.DispatchKey.CUDA}


def inference_only(qualname: str, lib: Any, impls: dict[str, Callable[..., Any]] | None = None) -> None:
    """Register an Autograd kernel for `qualname` ("oasr::gemm") whose backward raises a RuntimeError naming the
    op, and whose no-grad path calls `impls[backend]` ("CPU" / "CUDA": the kernels registered for those keys)
    directly where the module docstring allows, else redispatches below autograd."""
    name = qualname.replace("::", ".")

    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.grad_meta = [(t.shape, t.dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else None
                         for t in inputs]

    def backward(ctx: Any, *grads: Any) -> Any:
        # Not a raise here: AOTAutograd traces this backward when a graph with the op is compiled with grad on
        # (a forward that forgot torch.no_grad()), and the compile would fail. `oasr::no_backward` raises when a
        # backward really runs — eager or compiled — and is a shaped placeholder while tracing.
        g = next((x for x in grads if x is not None), None)
        return tuple(None if g is None or meta is None or not ctx.needs_input_grad[i]
                     else torch.ops.oasr.no_backward(g, name, list(meta[0]), meta[1])
                     for i, meta in enumerate(ctx.grad_meta))

    op = torch._library.utils.lookup_op(qualname)
    with_grad = make_autograd_impl(op, Info(backward, setup_context))  # the Function whose backward raises
    redispatch = op._handle.redispatch_boxed
    below = _C._after_autograd_keyset
    after_view = _C._after_ADInplaceOrView_keyset
    direct = {_BACKEND_KEYS[k]: fn for k, fn in (impls or {}).items()}
    # keyset (its raw bits) -> the implementation to call directly, or None: redispatch. A pure function of the
    # keyset, decided once per distinct keyset (a handful per process).
    decided: dict[int, Callable[..., Any] | None] = {}

    def decide(keyset: Any) -> Callable[..., Any] | None:
        rest = keyset & after_view
        top = rest.highestPriorityTypeId()
        impl = direct.get(top)
        return impl if impl is not None and rest.raw_repr() == _C.DispatchKeySet(top).raw_repr() else None

    is_grad_enabled, any_requires_grad, below_autograd = _C.is_grad_enabled, _C._any_requires_grad, \
        _C._AutoDispatchBelowAutograd

    def autograd_kernel(keyset: Any, *args: Any) -> Any:
        if is_grad_enabled() and any_requires_grad(*args):
            return with_grad(keyset, *args)
        raw = keyset.raw_repr()
        try:
            impl = decided[raw]
        except KeyError:
            impl = decided[raw] = decide(keyset)
        if impl is not None:
            return impl(*args)
        with below_autograd():
            return redispatch(keyset & below, *args)

    lib.impl(qualname.split("::", 1)[1], autograd_kernel, "Autograd", with_keyset=True)


def _no_backward(grad: torch.Tensor, op: str, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    """The gradient of an inference op's input: an error naming the op when it runs (see `inference_only`)."""
    raise RuntimeError(f"{op} has no backward (an inference kernel): run it under torch.no_grad() or "
                       "torch.inference_mode(), or use the aten op it replaces where gradients are needed")


# Defined like every oasr op (a Library, not the custom_op decorator: DESIGN decision 2); one kernel for all backends.
_LIB = torch.library.Library("oasr", "FRAGMENT")
_LIB.define("no_backward(Tensor grad, str op, SymInt[] shape, ScalarType dtype) -> Tensor")
_LIB.impl("no_backward", _no_backward, "CompositeExplicitAutograd")
torch.library.register_fake("oasr::no_backward", lambda grad, op, shape, dtype: grad.new_empty(shape, dtype=dtype),
                            lib=_LIB)


# (qualname, backend key) -> (the Python kernel, the Library registering it). Each backend kernel has a Library of its
# own so that the C++ hot path (families/hot_path.py) can take one key of one op over and give it back.
BACKEND_KERNELS: dict[tuple[str, str], tuple[Callable[..., Any], Any]] = {}


def register_backend_kernel(qualname: str, key: str, fn: Callable[..., Any]) -> None:
    """Register `fn` as `qualname`'s kernel for `key` ("CPU" / "CUDA") in a Library of its own (BACKEND_KERNELS)."""
    ns, name = qualname.split("::", 1)
    lib = torch.library.Library(ns, "IMPL")
    lib.impl(name, fn, key)
    BACKEND_KERNELS[(qualname, key)] = (fn, lib)


def unregister_backend_kernel(qualname: str, key: str) -> Callable[..., Any]:
    """Remove the Python kernel `register_backend_kernel` registered; returns it (to register it back later)."""
    fn, lib = BACKEND_KERNELS.pop((qualname, key))
    lib._destroy()
    return fn


def register_inference_op(lib: Any, name: str, *, cpu: Callable[..., Any], cuda: Callable[..., Any],
                          fake: Callable[..., Any]) -> None:
    """An oasr op's kernels in one call: `cpu` (the reference) and `cuda` for their keys, `fake` (shapes), and the
    inference-only Autograd kernel that calls them directly (module docstring)."""
    register_backend_kernel(f"oasr::{name}", "CPU", cpu)
    register_backend_kernel(f"oasr::{name}", "CUDA", cuda)
    torch.library.register_fake(f"oasr::{name}", fake, lib=lib)
    inference_only(f"oasr::{name}", lib, {"CPU": cpu, "CUDA": cuda})

"""Per-call host time of the oasr ops' CUDA path, measurable on a CPU machine.

  python benchmarks/host_overhead.py [--calls 2000] [--blocks 15] [--out host_overhead.json]
  python benchmarks/host_overhead.py --device cuda --out host_overhead_cuda.json      (the GPU machine)

Without CUDA graphs a served model is host-bound at small batches (docs/perf/e2e.md, "Serving traffic without CUDA
graphs"): every op call's Python costs count. This runs each family's real CUDA implementation (`_cuda` of the
op: checks, plan lookup, output allocation, the ctypes launch with its argument range checks) on CPU tensors, with
the kernel library replaced by a stub `.so` (gcc) that exports the same C symbols and returns 0 at once — so all up to
and including the ctypes call is the production code; the kernel itself, the CUDA caching allocator and
`cudaLaunchKernel` are not. Two paths per op:

  impl  the family's `_cuda` function called directly
  op    through the dispatcher: a mirror op (namespace `oasr_hostbench`, the same schema) whose CPU kernel is that
        `_cuda` function, with the same `inference_only` Autograd kernel — what a compiled graph's
        `torch.ops.oasr.<op>.default(...)` call costs

and two floors: `floor/op` (a mirror op whose kernel allocates the output and makes one stub ctypes call: the
dispatcher + autograd + one launch, nothing of ours) and `aten/empty` (one torch.empty). Shapes are the Conformer M
(d=512, FFN 2048) at M = 1000 rows; configs are region tables as a compiled graph bakes them.
On the GPU machine `--device cuda` times the real ops back to back at M = 16 (host-bound: the kernels take a few us)
instead: wall time per call through `torch.ops.oasr.*`, no stubs, beside the aten ops they replace (F.linear,
F.layer_norm). Each figure is the minimum over blocks of `--calls` calls, the callables alternating block by block.
`--hot-path` (both devices) also times the ops the C++ hot path serves through it (`cpp_op`;
oasr_ops/families/hot_path.py: gemm, the int8 GEMMs, the depthwise conv), served at the CPU key on the cpu with the
stub kernel library behind it.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, ".")

import torch  # noqa: E402

_PREFIXES = {  # launcher prefix -> ABI version constant (module, name)
    "smm": ("oasr_ops.codegen.emit_int8", "SMM_ABI_VERSION"),
    "smmr": ("oasr_ops.codegen.emit_int8", "SMMR_ABI_VERSION"),
    "lnq": ("oasr_ops.codegen.render_layer_norm_quant", "LNQ_ABI_VERSION"),
    "dwconv": ("oasr_ops.codegen.render_conv1d", "DWCONV_ABI_VERSION"),
    "bmm": ("oasr_ops.codegen.render", "BMM_ABI_VERSION"),
}


def _stub_library(tmp: Path) -> Path:
    """A .so exporting the generic and every family's launcher symbols; each returns 0 (or its ABI version)."""
    import importlib

    from oasr_ops.codegen.templates import ABI_VERSION

    lines = ["#include <stddef.h>",
             f"int oasr_abi_version(void) {{ return {ABI_VERSION}; }}",
             'const char* oasr_describe(void) { return "host-overhead stub"; }',
             "int oasr_run(void) { return 0; }", "int oasr_can_implement(void) { return 0; }",
             "size_t oasr_workspace_size(void) { return 0; }"]
    for prefix, (mod, const) in _PREFIXES.items():
        version = getattr(importlib.import_module(mod), const)
        lines += [f"int oasr_{prefix}_abi_version(void) {{ return {version}; }}",
                  f"int oasr_{prefix}_run(void) {{ return 0; }}",
                  f"int oasr_{prefix}_can_implement(void) {{ return 0; }}",
                  f"size_t oasr_{prefix}_workspace_size(void) {{ return 0; }}"]
    src, so = tmp / "stub.c", tmp / "stub.so"
    src.write_text("\n".join(lines) + "\n")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    return so


def _install_stubs(so: Path) -> None:
    """Every kernel load returns the stub library (the real `checked` launcher wrappers are built on top of it);
    the arch is sm90; the raw-stream query answers 0."""
    from oasr_ops.codegen import jit, loader
    from oasr_ops.families.layer_norm_quant import kernels as lnq_kernels

    cdll = ctypes.CDLL(str(so))
    i = ctypes.c_int
    generic = loader.KernelLibrary(
        so, "stub",
        loader.checked(cdll.oasr_run, [ctypes.c_void_p] * 4 + [i] * 5 + [ctypes.c_void_p, ctypes.c_size_t,
                                                                       ctypes.c_void_p], i),
        loader.checked(cdll.oasr_can_implement, [i] * 5, i),
        loader.checked(cdll.oasr_workspace_size, [i] * 5, ctypes.c_size_t), cdll)
    jit._load = lambda path: generic
    lnq_kernels.cuda_arch_of = lambda device: "90a"
    torch._C._cuda_getCurrentRawStream = lambda device: 0
    os.environ["OASR_ARCH"] = "sm90"


def _cases(device: str, m: int):
    """(name, op qualname, the family's `_cuda` function, args) for the ops an int8 / fp8 / fp16 Conformer serves."""
    from oasr_ops.families.conv1d import ops as conv1d
    from oasr_ops.families.gemm import ops as gemm
    from oasr_ops.families.layer_norm_quant import ops as lnq
    from oasr_ops.families.scaled_mm import act_quant, ops as smm, residual
    from oasr_ops.families.scaled_mm_fp8 import act_quant as act_quant_fp8, heuristic as fp8_heuristic
    from oasr_ops.families.scaled_mm_fp8 import ops as fp8, residual as residual_fp8
    from oasr_ops.runtime.plans import format_table
    from oasr_ops.runtime.registry import native_lane

    d, f = 512, 2048
    g = torch.Generator().manual_seed(0)

    def t(*shape, dtype=torch.float16):
        if dtype == torch.int8:
            return torch.randint(-127, 128, shape, generator=g, dtype=torch.int8).to(device)
        if dtype == torch.float8_e4m3fn:
            return torch.randn(*shape, generator=g).mul(8).to(dtype).to(device)
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    def table(cfg_id: str) -> str:
        return format_table([(4096, cfg_id), (None, cfg_id)])

    gemm_id = native_lane("sm90", "gemm").default.id
    smm_id = smm.heuristic_config(m, f, d, "sm90")
    res_id = smm.heuristic_config(m, d, f, "sm90")
    dw_id = native_lane("sm90", "conv1d").default.id
    fp8_id = fp8_heuristic.heuristic_config(m, f, d, "sm90")
    fp8_res_id = fp8_heuristic.heuristic_config(m, d, f, "sm90")
    e4m3 = torch.float8_e4m3fn
    a16, a8, af8 = t(1, m, d), t(m, d, dtype=torch.int8), t(m, d, dtype=e4m3)
    sa = torch.rand(m, generator=g).add(0.01).to(device)
    return [
        ("gemm", "oasr::gemm", gemm._gemm_cuda, (a16, t(f, d), t(f), "none", table(gemm_id))),
        # the torch arm (the DB answers cuBLAS: most sites of a small batch) on 2-D rows, as a compiled graph calls it,
        # and a tiny GEMM so that the matmul itself costs little; `aten/addmm_small` is what Inductor's own graph
        # calls for such a site
        ("gemm_torch_arm", "oasr::gemm", gemm._gemm_cuda,
         (t(1, 16), t(16, 16), t(16), "none", format_table([(4096, "torch"), (None, gemm_id)]))),
        ("scaled_mm", "oasr::scaled_mm", smm._scaled_mm_cuda,
         (a8, t(f, d, dtype=torch.int8), sa, torch.rand(f, generator=g).to(device), t(f), torch.float16,
          table(smm_id))),
        ("scaled_mm_act_quant", "oasr::scaled_mm_act_quant", act_quant._cuda,
         (a8, t(f, d, dtype=torch.int8), sa, torch.rand(f, generator=g).to(device),
          t(f, dtype=torch.float32), torch.full((1,), 0.05, device=device), "silu", table(smm_id))),
        ("scaled_mm_residual", "oasr::scaled_mm_residual", residual._cuda,
         (t(m, f, dtype=torch.int8), t(d, f, dtype=torch.int8), sa, torch.rand(d, generator=g).to(device), t(d),
          t(m, d), 0.5, torch.float16, table(res_id))),
        # the fp8 GEMMs of an fp8 Conformer (`fuse_quantization` with fp8_w8a8): the plain one with fp16 output,
        # the fc1 with its activation and static out_scale, the fc2 with the residual
        ("scaled_mm_fp8", "oasr::scaled_mm_fp8", fp8._scaled_mm_fp8_cuda,
         (af8, t(f, d, dtype=e4m3), sa, torch.rand(f, generator=g).to(device), t(f), torch.float16,
          table(fp8_id))),
        ("scaled_mm_fp8_act_quant", "oasr::scaled_mm_fp8_act_quant", act_quant_fp8._cuda,
         (af8, t(f, d, dtype=e4m3), sa, torch.rand(f, generator=g).to(device),
          t(f, dtype=torch.float32), torch.full((1,), 0.05, device=device), "silu", table(fp8_id))),
        ("scaled_mm_fp8_residual", "oasr::scaled_mm_fp8_residual", residual_fp8._cuda,
         (t(m, f, dtype=e4m3), t(d, f, dtype=e4m3), sa, torch.rand(d, generator=g).to(device), t(d),
          t(m, d), 0.5, torch.float16, table(fp8_res_id))),
        ("layer_norm_quant", "oasr::layer_norm_quant", lnq._cuda,
         (a16, t(d), t(d), 1e-5, False, "int8", "auto")),
        ("conv1d_depthwise", "oasr::conv1d_depthwise", conv1d._cuda,
         (t(1, m, d), t(d, 1, 31, dtype=torch.float32), t(d, dtype=torch.float32), 15, "btc", "silu",
          table(dw_id), False)),
    ]


def _mirror(lib, qualname: str, impl, dispatch_key: str) -> object:
    """An op of namespace oasr_hostbench with `qualname`'s schema, `impl` as its kernel, and the oasr ops'
    Autograd kernel."""
    from oasr_ops.families.autograd import inference_only

    op = torch._library.utils.lookup_op(qualname)
    schema = str(op._schema).split("::", 1)[1]
    name = schema.split("(", 1)[0]
    lib.define(schema)
    lib.impl(name, impl, dispatch_key)
    inference_only(f"oasr_hostbench::{name}", lib, {dispatch_key: impl})
    return getattr(torch.ops.oasr_hostbench, name).default


def _time(fns: dict, args, calls: int, blocks: int, sync) -> dict[str, float]:
    """µs per call of each of `fns` (name -> callable) on `args`: blocks of `calls` calls, the callables alternating
    block by block; the minimum over blocks (a deterministic host path: the least-disturbed block is its cost)."""
    for fn in fns.values():
        for _ in range(200):
            fn(*args)
    sync()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(blocks):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            sync()
            best[name] = min(best[name], (time.perf_counter() - t0) / calls * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--calls", type=int, default=2000, help="calls per block")
    ap.add_argument("--blocks", type=int, default=15)
    ap.add_argument("--rows", type=int, default=None, help="M (default: 1000 on cpu, 16 on cuda)")
    ap.add_argument("--hot-path", action="store_true",
                    help="also time the ops the C++ hot path serves through it (`oasr_ops.enable_cpp_hot_path()`; "
                         "on the cpu, served at the CPU key with the stub kernel library)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    device = args.device
    m = args.rows or (1000 if device == "cpu" else 16)
    tmp = Path(tempfile.mkdtemp(prefix="oasr-host-"))
    if device == "cpu":
        _install_stubs(_stub_library(tmp))
        sync = lambda: None  # noqa: E731
    else:
        sync = torch.cuda.synchronize
    import oasr_ops  # noqa: F401  (registers the ops)

    results: dict[str, dict[str, float]] = {}
    if device == "cpu":
        lib = torch.library.Library("oasr_hostbench", "DEF")
        stub = ctypes.CDLL(str(tmp / "stub.so")).oasr_smm_run
        stub.argtypes, stub.restype = [ctypes.c_void_p] * 4, ctypes.c_int
        lib.define("floor(Tensor a, Tensor w) -> Tensor")

        def floor(a, w):
            out = torch.empty((*a.shape[:-1], w.shape[0]), dtype=a.dtype, device=a.device)
            stub(a.data_ptr(), w.data_ptr(), None, out.data_ptr())
            return out
        lib.impl("floor", floor, "CPU")
        from oasr_ops.families.autograd import inference_only
        inference_only("oasr_hostbench::floor", lib, {"CPU": floor})
        fa, fw = torch.zeros(m, 512, dtype=torch.float16), torch.zeros(2048, 512, dtype=torch.float16)
        results["floor"] = _time({"op": torch.ops.oasr_hostbench.floor.default}, (fa, fw), args.calls, args.blocks,
                                 sync)
        results["aten/empty"] = _time({"op": lambda: torch.empty((m, 2048), dtype=torch.float16)}, (), args.calls,
                                      args.blocks, sync)
    from oasr_ops.families import hot_path

    mirrors: dict[str, object] = {}
    answered: dict[str, int] = {}
    with torch.no_grad():
        for name, qualname, impl, op_args in _cases(device, m):
            if device == "cpu":
                if qualname not in mirrors:  # one mirror per op (its kernel is the same `_cuda` function)
                    mirrors[qualname] = _mirror(lib, qualname, impl, "CPU")
                fns = {"impl": impl, "op": mirrors[qualname]}
            else:
                fns = {"op": torch._library.utils.lookup_op(qualname)}
            row = _time(fns, op_args, args.calls, args.blocks, sync)
            if args.hot_path and qualname.split("::")[1] in hot_path.OPS:
                # the real op through its C++ hot path (the first call misses and installs the plan); on the cpu
                # served at the CPU key, its misses going to this `_cuda` function with the stub kernels
                hot_path.enable(device.upper())
                hot_path.collect_calls()
                row["cpp_op"] = _time({"op": torch._library.utils.lookup_op(qualname)}, op_args, args.calls,
                                      args.blocks, sync)["op"]
                answered[name] = sum(torch.ops.oasr_hot.drain_calls()[1::2])  # calls the C++ table answered
                hot_path.disable()
            results[name] = row
            print(f"{name:22s} " + "  ".join(f"{k} {v:6.2f} us" for k, v in row.items()), flush=True)
    if device == "cuda":  # what the aten ops these replace cost on the same host (cuBLAS / the aten LayerNorm)
        d, f = 512, 2048
        x, w, b = (torch.randn(1, m, d, device="cuda").half(), torch.randn(f, d, device="cuda").half(),
                   torch.randn(f, device="cuda").half())
        ln_w, ln_b = torch.randn(d, device="cuda").half(), torch.randn(d, device="cuda").half()
        with torch.no_grad():
            results["aten/linear"] = _time({"op": torch.nn.functional.linear}, (x, w, b), args.calls, args.blocks,
                                           sync)
            results["aten/layer_norm"] = _time({"op": lambda t: torch.nn.functional.layer_norm(t, (d,), ln_w, ln_b)},
                                               (x,), args.calls, args.blocks, sync)
    with torch.no_grad():  # the torch arm's baselines: what Inductor calls for a Linear site (2-D addmm into its
        # buffer), and F.linear
        sx, sw, sb = (torch.randn(1, 16).half().to(device), torch.randn(16, 16).half().to(device),
                      torch.randn(16).half().to(device))
        swt, sout = sw.t(), torch.empty(1, 16, dtype=torch.float16, device=device)
        results["aten/addmm_small"] = _time({"op": lambda: torch.addmm(sb, sx, swt, out=sout)}, (), args.calls,
                                            args.blocks, sync)
        results["aten/linear_small"] = _time({"op": torch.nn.functional.linear}, (sx, sw, sb), args.calls,
                                             args.blocks, sync)
    for name in ("floor", "aten/empty", "aten/linear", "aten/layer_norm", "aten/addmm_small", "aten/linear_small"):
        if name in results:
            print(f"{name:22s} op {results[name]['op']:6.2f} us")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": device, "rows": m, "calls": args.calls,
                                              "torch": torch.__version__, "us_per_call": results,
                                              "cpp_answered_calls": answered}, indent=1))


if __name__ == "__main__":
    main()

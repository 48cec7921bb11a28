"""Host time per call of a compiled model that is not kernel work: Dynamo's prologue (guards, and fetching every
parameter and buffer of every layer from the module tree), measured with a backend that runs nothing.

    python benchmarks/dynamo_prologue.py [--size M] [--calls 300] [--rounds 3] [--recursive-dict-tags]

Variants of the example Conformer (fp32, CPU): the model as built, `quantize_(..., "int8_w8a8")` on every
qualifying Linear, and the same calibrated (`oasr_ops.calibrate`). Prints per variant the graph's input count
the median host microseconds per call, and the part of it that is Dynamo's guard check (the compiled entry's
guard manager run on the same arguments). `--recursive-dict-tags` also measures every variant with
`torch._dynamo.config.use_recursive_dict_tags_for_guards` on (guards of modules whose dicts did not change are
skipped). Why it matters: in a synchronous call (the latency a user measures) the
GPU idles during this time; a graph with more tensor inputs pays more of it (docs/perf/e2e.md, session 6).
Nothing is asserted.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")


def host_us(model: torch.nn.Module, x: tuple, calls: int) -> tuple[int, float, float]:
    """(graph inputs, host us per call, guard-check us per call)."""
    import inspect

    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    inputs: list[int] = []

    def null_backend(gm, example_inputs):
        inputs.append(sum(1 for n in gm.graph.nodes if n.op == "placeholder"))
        outs = gm(*example_inputs)
        return lambda *_args: outs

    torch._dynamo.reset()
    fn = torch.compile(model, backend=null_backend)
    with torch.no_grad():
        fn(*x)
        ts = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn(*x)
            ts.append(time.perf_counter() - t0)
        guards = _debug_get_cache_entry_list(type(model).forward.__code__)[0].guard_manager
        names = list(inspect.signature(type(model).forward).parameters)
        f_locals = {n: None for n in names} | dict(zip(names, (model, *x)))
        if not guards.check(f_locals):
            raise RuntimeError("the guards fail on the call's own arguments: the locals are not the frame's")
        gs = []
        for _ in range(calls):
            t0 = time.perf_counter()
            guards.check(f_locals)
            gs.append(time.perf_counter() - t0)
    return inputs[0], statistics.median(ts) * 1e6, statistics.median(gs) * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="M")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--recursive-dict-tags", action="store_true",
                   help="also measure with torch._dynamo.config.use_recursive_dict_tags_for_guards on")
    a = p.parse_args()

    import oasr_ops
    from examples.conformer import build_model, example_inputs

    model = build_model(a.size, dtype=torch.float32, device="cpu").eval()
    x = tuple(example_inputs(batch=1, frames=100, dtype=torch.float32, device="cpu"))
    int8 = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8")
    calibrated = copy.deepcopy(int8)
    oasr_ops.calibrate(calibrated, [x])
    variants = {"fp32": model, "int8": int8, "int8 calibrated": calibrated}
    res: dict[str, list[float]] = {}
    guard: dict[str, list[float]] = {}
    n_inputs: dict[str, int] = {}
    for _ in range(a.rounds):
        for tags in (False, True) if a.recursive_dict_tags else (False,):
            with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=tags):
                for name, m in variants.items():
                    key = name + (" +dict-tags" if tags else "")
                    n_inputs[key], us, g = host_us(m, x, a.calls)
                    res.setdefault(key, []).append(us)
                    guard.setdefault(key, []).append(g)
    for name, ts in res.items():
        print(f"{name:28s} {n_inputs[name]:4d} graph inputs  {statistics.median(ts):7.1f} us per call, of which "
              f"guards {statistics.median(guard[name]):6.1f} us (rounds: {', '.join(f'{t:.0f}' for t in ts)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

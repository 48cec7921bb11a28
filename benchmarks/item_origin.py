"""Where the serving Conformer's `aten::item` calls come from: each one is a device-to-host sync point.

Why: the launch profiles of the compiled Conformer M served without CUDA graphs (docs/perf/e2e.md, sessions 22-23)
count 112 `aten::item` per forward in every variant, fp16 Inductor included; the SDPA measurement
(`benchmarks/sdpa_host.py`) ruled out the unmasked attention call. This runs the serving model (with `lengths`, so
with its padding masks) under the profiler with Python stacks, eager and compiled, and groups the `aten::item`
events by the innermost frames of the model or of the compiled graph's wrapper that made them.

    python benchmarks/item_origin.py --out item_origin.json [--size M --frames 394 --batch 1]
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def origins(fn, args, frames: int = 4, cuda: bool = False) -> tuple[int, list[tuple[str, int]]]:
    """(item calls in one call of fn, [(the innermost `frames` stack frames outside torch's profiler, count)])."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts, with_stack=True) as prof:
        fn(*args)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    by_stack: collections.Counter[str] = collections.Counter()
    total = 0
    for evt in prof.events():
        if evt.name != "aten::item":
            continue
        total += 1
        stack = [s for s in (evt.stack or []) if "torch/profiler" not in s and "torch/autograd/profiler" not in s]
        parents, p = [], evt.cpu_parent
        while p is not None and len(parents) < 4:  # the ops that called it (a C++ caller has no Python stack)
            parents.append(p.name)
            p = p.cpu_parent
        by_stack[" <- ".join(stack[:frames]) + f" [called by {' <- '.join(parents) or 'nothing'}]"] += 1
    return total, by_stack.most_common()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="M")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--frames", type=int, default=394)
    ap.add_argument("--also-frames", type=int, default=0,
                    help="call once at this many frames too before profiling (a second shape: the compiled model "
                         "recompiles with dynamic sizes, as under serving traffic)")
    ap.add_argument("--backends", default="eager,inductor", help="comma list of eager and torch.compile backends")
    ap.add_argument("--device", default="cuda", help="cuda (fp16), or cpu (fp32: a smoke run of this script)")
    ap.add_argument("--grad-mode", choices=("inference", "no_grad"), default="inference",
                    help="torch.inference_mode or torch.no_grad (what benchmarks/e2e_serving.py runs under)")
    ap.add_argument("--cuda-activity", action="store_true",
                    help="profile CUDA activity too (as e2e_serving.py's launch profile does)")
    ap.add_argument("--dynamic", action="store_true",
                    help="torch.compile(..., dynamic=True), as benchmarks/e2e_serving.py compiles")
    ap.add_argument("--dynamo-config", action="append", default=[], metavar="KEY=VALUE",
                    help="set torch._dynamo.config.KEY (a Python literal) before compiling; repeatable")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from examples.conformer import build_model, example_inputs

    import ast

    import torch._dynamo.config as dynamo_config

    for kv in args.dynamo_config:
        key, _, value = kv.partition("=")
        setattr(dynamo_config, key, ast.literal_eval(value))
    dtype = torch.float16 if args.device == "cuda" else torch.float32
    model = build_model(size=args.size).to(args.device, dtype).eval()
    feats, lengths = example_inputs(batch=args.batch, frames=args.frames, device=args.device, with_lengths=True)
    feats = feats.to(dtype)
    res: dict = {**vars(args), "torch": torch.__version__, "backends": {},
                 "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    with torch.inference_mode() if args.grad_mode == "inference" else torch.no_grad():
        for name in args.backends.split(","):
            dynamic = True if args.dynamic else None  # None: Dynamo's default (dynamic on a second shape)
            fn = model if name == "eager" else torch.compile(model, backend=name, dynamic=dynamic)
            for _ in range(3):  # compile and warm up
                fn(feats, lengths)
            if args.also_frames:
                other = example_inputs(batch=args.batch, frames=args.also_frames, device=args.device,
                                       with_lengths=True)
                for _ in range(2):
                    fn(other[0].to(dtype), other[1])
                for _ in range(2):
                    fn(feats, lengths)
            total, stacks = origins(fn, (feats, lengths), cuda=args.cuda_activity)
            res["backends"][name] = {"item_calls": total, "origins": stacks[:20]}
            print(f"== {name}: {total} aten::item per forward", flush=True)
            for s, n in stacks[:20]:
                print(f"  {n:4d}  {s}", flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

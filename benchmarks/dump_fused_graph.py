"""Print Inductor's output code for one int8-fused Conformer block compiled with `backend="oasr"` (a debugging
aid: which kernels a fused graph launches, and what each Triton kernel computes).

    TORCH_LOGS=output_code python benchmarks/dump_fused_graph.py [--device cuda] [--size S] [--blocks 1]
"""
from __future__ import annotations

import argparse
import copy
import sys

import torch

sys.path.insert(0, ".")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="S")
    ap.add_argument("--blocks", type=int, default=1)
    ap.add_argument("--fuse-quantization", default="act", choices=("act", "true"))
    a = ap.parse_args()
    import oasr_ops
    import examples.conformer as conformer
    from oasr_ops.inductor.backend import oasr_backend

    dt = torch.float16 if a.device == "cuda" else torch.float32
    m = conformer.build_model(size=a.size, dtype=dt, device=a.device, seed=0).eval()
    m.blocks = m.blocks[:a.blocks]
    x = tuple(conformer.example_inputs(batch=2, frames=200, dtype=dt, device=a.device, seed=1))
    q = oasr_ops.quantize_(copy.deepcopy(m), "int8_w8a8", filter_fn=oasr_ops.fusable_filter(copy.deepcopy(m), *x))
    oasr_ops.calibrate(q, [x])
    torch.compiler.reset()
    fq = True if a.fuse_quantization == "true" else "act"
    fn = torch.compile(q, backend=oasr_backend, options={"fuse_quantization": fq, "fuse_residual": True})
    with torch.no_grad():
        fn(*x)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Quick start: run `torch.ops.oasr.gemm` over a small Linear stack and print which config served each call
(on a GPU; a CPU prints one summary line).

With a GPU and nvcc, the production kernels (lane default + coverage basis + what the tuning DB references) are
built or loaded from the JIT cache first; on a CPU the op runs its reference implementation.
"""
from __future__ import annotations

import time

import torch

import oasr_ops
from oasr_ops.families.gemm.ops import served


def main() -> None:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = torch.float16 if cuda else torch.bfloat16
    if cuda:
        from oasr_ops.families.gemm.kernels import lanes_for, production_configs, specs_for
        from oasr_ops.codegen.jit import build_many
        from oasr_ops.runtime.arch import current_arch_family

        arch = current_arch_family()
        specs = [s for lane in lanes_for(arch)[:1] for s in specs_for(lane, production_configs(lane, arch),
                                                                     ("fp16",), arch)]
        t0 = time.monotonic()
        print(build_many(specs).summary().splitlines()[0], f"({time.monotonic() - t0:.1f}s)")
    else:
        print("no CUDA GPU: torch.ops.oasr.gemm runs its CPU reference path (fp32 accumulate, one rounding)")

    torch.manual_seed(0)
    d = 512

    def linear(n, k):
        return torch.randn(n, k, device=device, dtype=dtype) / k**0.5, torch.randn(n, device=device, dtype=dtype)

    ffn1, ffn2, qkv, out_proj = linear(4 * d, d), linear(d, 4 * d), linear(3 * d, d), linear(d, d)
    for batch, frames in ((1, 7), (4, 250), (16, 250)):  # a Conformer-style block's GEMMs at three sizes
        x = torch.randn(batch, frames, d, device=device, dtype=dtype)
        h = oasr_ops.gemm(x, *ffn1, activation="silu")
        x = x + oasr_ops.gemm(h, *ffn2)
        q = oasr_ops.gemm(x, *qkv)
        x = oasr_ops.gemm(q[..., :d].contiguous(), *out_proj, activation="relu")
        assert torch.isfinite(x).all()
    if cuda:
        torch.cuda.synchronize()
        for p in sorted(served(), key=lambda p: (p.signature, p.config)):
            print(f"{p.signature:45s} -> {p.config:28s} tier={p.tier:8s} calls={p.calls}")
    else:
        print(f"ran 12 oasr.gemm calls on the CPU reference path; output {tuple(x.shape)}")


if __name__ == "__main__":
    main()

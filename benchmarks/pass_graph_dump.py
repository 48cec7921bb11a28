"""Print the post-grad graph the oasr pass receives and what it leaves, for one module compiled on this machine.

Why: the pass sees Inductor's post-grad graph, whose decompositions differ between torch versions and devices;
a matcher that works on one can miss on another. This shows both graphs and the pass's sites and skip reasons.

    python benchmarks/pass_graph_dump.py --what conv_module --dtype fp16 --frames 250 [--masked] --out DIR
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import oasr_ops  # noqa: F401
from examples import conformer
from oasr_ops.inductor import rewrite as rw
from oasr_ops.inductor.backend import oasr_backend


def _module(what: str, d: int, kw: int, device: str) -> torch.nn.Module:
    if what == "conv_module":
        cfg = conformer.config_for("S", d_model=d, num_heads=4, conv_kernel=kw, conv_impl="conv1d")
        return conformer.Conv1dConvolutionModule(cfg).eval().to(device)
    if what == "frontend":
        return conformer.Conv2dSubsampling4(80, d, d).eval().to(device)
    raise SystemExit(f"unknown --what {what!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what", default="conv_module", choices=["conv_module", "frontend"])
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--frames", type=int, default=250)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--masked", action="store_true")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if a.dtype == "fp16" else torch.bfloat16
    graphs: list[str] = []
    orig = rw.OasrRewritePass.__call__

    def hooked(self, graph):  # noqa: ANN001
        graphs.append(str(graph))
        orig(self, graph)
        graphs.append(str(graph))

    rw.OasrRewritePass.__call__ = hooked
    m = _module(a.what, a.width, 31, dev).to(dtype)
    if a.what == "conv_module":
        x = torch.randn(3, a.frames, a.width, device=dev, dtype=dtype)
        mask = (torch.arange(a.frames, device=dev)[None] < torch.tensor([a.frames, a.frames // 2 + 1, 3],
                                                                         device=dev)[:, None]) if a.masked else None
        args = (x, mask)
    else:
        args = (torch.randn(2, a.frames, 80, device=dev, dtype=dtype),)
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        torch.compile(m, backend=oasr_backend, dynamic=False)(*args)
    a.out.mkdir(parents=True, exist_ok=True)
    tag = f"{a.what}_{a.dtype}_{a.frames}{'_masked' if a.masked else ''}"
    (a.out / f"{tag}.graphs.txt").write_text("\n\n=== after the pass ===\n".join(graphs))
    sites = [{"family": s.family, "n": s.n, "k": s.k, "node": getattr(s, "node", None)}
             for r in rw.rewrite_log() for s in r.sites]
    skipped = [list(s) for r in rw.rewrite_log() for s in r.skipped]
    (a.out / f"{tag}.json").write_text(json.dumps({"torch": torch.__version__, "device": dev, "sites": sites,
                                                   "skipped": skipped}, indent=1))
    print(tag, "sites", sites, "skipped", skipped)


if __name__ == "__main__":
    main()

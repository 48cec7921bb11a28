"""Where a quantization scheme's output error comes from: quantize one group of Linear layers at a time (eager,
on the CPU: the ops' reference formulas, no kernel involved) and measure the encoder's output error vs fp32.

  python benchmarks/quant_error_by_layer.py --model examples.conformer:build_model --model-args size=M \
      --inputs examples.conformer:example_inputs --input-args batch=2,frames=500 \
      --schemes fp8_w8a8,int8_w8a8 --extra "ff=\\.ff[12]\\." --out quant_error_conformer_M.json

Groups: every Linear role (the module name with its `blocks.<i>.` prefix removed, e.g. `ff1.fc1`, `mhsa.qkv`: one
group holds that layer in every block), `all`, and each `--extra NAME=REGEX` (the layers whose name matches).
Each group is quantized with `quantize_(model, scheme, filter_fn=...)` on fp32 weights and run eagerly: activations
quantized per token on the fly (`int8_w8a8`: amax / 127, `fp8_w8a8`: e4m3, amax / 448), weights per output channel.
Errors vs the fp32 model: max |out - ref| / max |ref| (the e2e benchmarks' measure) and the RMS ratio. Uncorrelated
per-group errors add in quadrature: sqrt(sum of the groups' squares) ~ `all`.

Why on the CPU: the question is the number format's, not the kernels' (the GPU e2e runs measure the deployed
error; docs/perf/e2e.md compares the two).
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import time

import torch

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")


def role(fqn: str) -> str:
    """`blocks.3.ff1.fc1` -> `ff1.fc1`: one group per layer position, across the repeated blocks."""
    return re.sub(r"(^|\.)\d+\.", r"\1", re.sub(r"^blocks\.\d+\.", "", fqn))


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    d = (out.double() - ref).abs()
    return {"max_rel": (d.max() / ref.abs().max()).item(),
            "rms_rel": (d.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()}


def main() -> int:
    from e2e_compare import add_model_arguments

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(p)
    p.add_argument("--schemes", default="fp8_w8a8,int8_w8a8")
    p.add_argument("--extra", action="append", default=[], help="NAME=REGEX: one more group (re.search on names)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", default=None)
    a = p.parse_args()

    import oasr_ops
    from e2e_compare import _kwargs, _load

    if a.threads:
        torch.set_num_threads(a.threads)
    margs, iargs = _kwargs(a.model_args), _kwargs(a.input_args)
    model = _load(a.model)(**margs, dtype=torch.float32, device="cpu", seed=0).eval()
    x = tuple(_load(a.inputs)(**iargs, dtype=torch.float32, device="cpu", seed=1))
    with torch.no_grad():
        ref = model(*x).double()
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    groups: dict[str, set[str]] = {"all": set(names)}
    for n in names:
        groups.setdefault(role(n), set()).add(n)
    for spec in a.extra:
        name, sep, rx = spec.partition("=")
        if not sep or not name:
            p.error(f"--extra {spec!r}: expected NAME=REGEX")
        try:
            pat = re.compile(rx)
        except re.error as e:
            p.error(f"--extra {spec!r}: bad regex: {e}")
        groups[name] = {n for n in names if pat.search(n)}
        if not groups[name]:
            p.error(f"--extra {spec!r}: matches none of the model's {len(names)} Linear layers")

    rows = []
    for scheme in a.schemes.split(","):
        for g, members in groups.items():
            t0 = time.perf_counter()
            q = oasr_ops.quantize_(copy.deepcopy(model), scheme, filter_fn=lambda _m, fqn, s=members: fqn in s)
            with torch.no_grad():
                e = errors(q(*x), ref)
            rows.append({"scheme": scheme, "group": g, "layers": len(members), **e})
            print(f"{scheme:10s} {g:24s} {len(members):4d} layers  max_rel {e['max_rel']:.4f}  "
                  f"rms_rel {e['rms_rel']:.4f}  ({time.perf_counter() - t0:.1f} s)", flush=True)
        roles = [r for r in rows if r["scheme"] == scheme and r["group"] in {role(n) for n in names}]
        quad = sum(r["rms_rel"] ** 2 for r in roles) ** 0.5
        print(f"{scheme:10s} quadrature sum of the per-role rms_rel: {quad:.4f}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"model": a.model, "model_args": margs, "inputs": iargs, "torch": torch.__version__,
                       "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

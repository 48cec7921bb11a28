"""A/B of the conv2d direct kernel's template: render `templates/conv2d_direct.cu.j2` as of a git revision (old_*)
and as in the working tree (new_*) for some direct configs, plus a variant of one new source (x_reg_*: the 3x3,
Cin = 1 register path instead of the tensor-core one). Used for the first conv's rewrite (docs/kernels.md, "The
frontend conv2d"; logs benchmarks/logs/sm90_conv1_direct_ab*.txt). `--old REV[:CID,...]` is repeatable (files
old_<REV>_<CID>.cu).

  python benchmarks/conv2d_direct_ab/render.py --old 4d78113 --out build/conv2d_ab      (CPU host, needs the repo)
  bash benchmarks/conv2d_direct_ab/build.sh build/conv2d_ab                             (CPU host with nvcc)
  bash benchmarks/conv2d_direct_ab/run.sh build/conv2d_ab OUT_FILE                      (GPU host: runs only)

The harness (harness.cu) dlopens each .so, checks it against a float64 reference on random inputs with NaN-poisoned
outputs (bad = elements outside 1e-3 + 1e-3 |ref|), and times it (5 rounds, median us per call).
"""
from __future__ import annotations

import argparse
import dataclasses
import pathlib
import subprocess
import tempfile

from oasr_ops.codegen.render_conv2d import DIRECT_TEMPLATE, render_conv2d
from oasr_ops.codegen.templates import environment_for
from oasr_ops.configs import parse
from oasr_ops.families.conv2d_activation.lanes import SM90_F16_CONV2D

REPO = pathlib.Path(__file__).resolve().parents[2]  # the tree's templates, also under an installed package
NEW = ("dc128x128_v8_n256", "dc64x128_v8_n128", "dc256x128_v8_n128", "dc256x128_v8_n256", "dc512x128_v8_n256",
       "dc256x64_v8_n128", "dc256x512_v8_n512")
OLD = ("dc128x128_v8_n256",)
MMA = "constexpr bool kMmaPath = kVec == 8"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", action="append", required=True,
                   help=f"REV[:CID,CID...]: a git revision of the baseline template and its configs (default {OLD})")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    olds = [(o.split(":")[0], tuple(o.split(":")[1].split(",")) if ":" in o else OLD) for o in a.old]
    ids = sorted(set(NEW).union(*(c for _, c in olds)))
    lane = dataclasses.replace(SM90_F16_CONV2D, space=tuple(SM90_F16_CONV2D.space) + tuple(
        parse(i) for i in ids if parse(i) not in SM90_F16_CONV2D.space))
    new_env = environment_for(REPO / "templates")
    for rev, cids in olds:
        with tempfile.TemporaryDirectory() as old_dir:
            for t in (REPO / "templates").iterdir():
                src = subprocess.run(["git", "show", f"{rev}:templates/{t.name}"], capture_output=True, text=True,
                                     cwd=REPO)
                if src.returncode == 0:
                    (pathlib.Path(old_dir) / t.name).write_text(src.stdout)
                elif t.name == DIRECT_TEMPLATE:
                    raise SystemExit(f"git show {rev}:templates/{t.name} failed: {src.stderr.strip()}")
            old_env = environment_for(pathlib.Path(old_dir))
            for cid in cids:
                (out / f"old_{rev}_{cid}.cu").write_text(render_conv2d(lane, parse(cid), "fp16", old_env))
    for cid in NEW:
        (out / f"new_{cid}.cu").write_text(render_conv2d(lane, parse(cid), "fp16", new_env))
    base = (out / "new_dc256x128_v8_n128.cu").read_text()
    assert MMA in base, "the variant below turns the tensor-core path off"
    (out / "x_reg_dc256x128_v8_n128.cu").write_text(base.replace(MMA, "constexpr bool kMmaPath = false && kVec == 8"))
    print(f"{len(list(out.glob('*.cu')))} sources in {out}")


if __name__ == "__main__":
    main()

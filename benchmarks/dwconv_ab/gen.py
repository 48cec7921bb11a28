"""A/B of the depthwise conv1d template (templates/conv1d_depthwise.cu.j2): render it as of a git revision (base_*)
and as in the working tree (repo_*) for some configs and both layouts, each in its own namespace, into one include
file that bench.cu walks (log: benchmarks/logs/sm90_dwconv_micro_3.txt, with base = 4d78113).

  python benchmarks/dwconv_ab/gen.py --base 4d78113 --out build/dwconv_ab        (CPU host, needs the repo)
  bash benchmarks/dwconv_ab/build.sh build/dwconv_ab                              (CPU host with nvcc)
  bash benchmarks/dwconv_ab/run.sh build/dwconv_ab OUT_FILE                       (GPU host: runs only)

The exploratory variants of the kernel's rewrite (sm90_dwconv_micro_{1,2}.txt, _3x.txt: weights in registers,
division flavours, multi-tile and two-phase CTAs) were measured with templates that are not kept; docs/kernels.md
("The depthwise conv1d") records what each gave.
"""
from __future__ import annotations

import argparse
import pathlib
import subprocess

from oasr_ops.codegen.templates import environment_for


REPO = pathlib.Path(__file__).resolve().parents[2]  # the tree's template, also under an installed package
KWS = [3, 7, 31]
TEMPLATE = "conv1d_depthwise.cu.j2"
# name, template (base | repo), layout, tile_t, tile_c, vec, threads
VARIANTS = [
    ("base_64x32_v8_n128", "base", "btc", 64, 32, 8, 128),
    ("repo_64x32_v8_n128", "repo", "btc", 64, 32, 8, 128),
    ("repo_64x32_v8_n256", "repo", "btc", 64, 32, 8, 256),
    ("repo_128x32_v8_n256", "repo", "btc", 128, 32, 8, 256),
    ("repo_256x32_v8_n512", "repo", "btc", 256, 32, 8, 512),
    ("repo_128x64_v8_n512", "repo", "btc", 128, 64, 8, 512),
    ("repo_16x64_v8_n128", "repo", "btc", 16, 64, 8, 128),
    ("repo_32x64_v8_n256", "repo", "btc", 32, 64, 8, 256),
    ("base_64x32_v8_n128", "base", "bct", 64, 32, 8, 128),
    ("base_64x32_v16_n128", "base", "bct", 64, 32, 16, 128),
    ("repo_64x32_v8_n128", "repo", "bct", 64, 32, 8, 128),
    ("repo_64x32_v16_n128", "repo", "bct", 64, 32, 16, 128),
    ("repo_128x32_v8_n256", "repo", "bct", 128, 32, 8, 256),
    ("repo_256x32_v8_n512", "repo", "bct", 256, 32, 8, 512),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="git revision of the baseline template")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    base = subprocess.run(["git", "show", f"{a.base}:templates/{TEMPLATE}"], capture_output=True, text=True,
                          cwd=REPO)
    if base.returncode:
        raise SystemExit(f"git show {a.base}:templates/{TEMPLATE} failed: {base.stderr.strip()}")
    sources = {"base": base.stdout, "repo": (REPO / "templates" / TEMPLATE).read_text()}
    env = environment_for(REPO / "templates")
    chunks, table = [], []
    for name, tpl, layout, tt, tc, vec, thr in VARIANTS:
        ns = f"{name}_{layout}"
        src = env.from_string(sources[tpl]).render(
            lane="bench", config_id=name, dtype=f"fp16_{layout}", element="__half", layout=layout, tile_t=tt,
            tile_c=tc, vec=vec, threads=thr, rows=tt * tc // thr, kernel_widths=KWS, abi_version=1,
            dwconv_abi_version=2)
        src = "\n".join(ln for ln in src.splitlines()
                        if not ln.startswith("#include") and not ln.startswith("#define OASR_EXPORT"))
        chunks.append(f"namespace {ns} {{\n{src}\n}}  // namespace {ns}\n")
        table.append(f'  {{"{name}", "{layout}", {ns}::oasr_dwconv_run}},')
    (out / "variants.inc").write_text(
        "".join(chunks)
        + "struct Variant { const char* name; const char* layout; int (*run)(const void*, const void*, int, "
          "const void*, int, void*, int, int, int, int, int, int, void*, size_t, void*); };\n"
        + "static const Variant kVariants[] = {\n" + "\n".join(table) + "\n};\n")
    print(f"{len(VARIANTS)} variants in {out / 'variants.inc'}")


if __name__ == "__main__":
    main()

"""Prebuild the fused-quantization kernels the GPU steps load (issue 15), which `oasr tune prebuild` does not plan
yet, in parallel (on a GPU host: `--jobs 16`), so that no step compiles a kernel serially on first use:

* the `int8_gelu` / `int8_silu` epilogue variants (`--acts`; fp32 bias and the fp16 models' bias) of the tiles
  the act-quant sites resolve to on sm90 (`act_quant.select_act_quant_config` at the Conformer M and
  Whisper-small FFN shapes) plus the lane default;
* `layer_norm_quant`: every config, fp16 and bf16, int8 and fp8 (`--lnq all`, the GPU tests), or only the configs
  `AUTO_BY_WIDTH` serves at the encoders' widths, fp16, int8 (and fp8 with `--fp8-acts`) (`--lnq auto`, the e2e
  runs);
* with `--int8-fp16`: the fp16-output variant of every int8 tile (the int8 layers that are not fused, and the
  calibration's eager forward, resolve to any of them through the DB);
* with `--residual`: the `fp16_res` variant (`oasr.scaled_mm_residual`, `fuse_residual=True`) of the tiles the
  fc2 residual sites resolve to (`residual.select_residual_config` at the same FFN shapes) plus the lane default;
* with `--production FAMILIES`: those families' production sets in fp16 (`prebuild_specs`, as `oasr tune prebuild
  --family F --dtypes fp16`), in the same parallel build;
* with `--fp8-acts gelu,silu`: the fp8 `fp8_<act>` epilogue variants (op `scaled_mm_fp8_act_quant`) of the sm90
  tiles the fp8 act-quant sites resolve to plus the lane default (`--fp8-tiles sites`), of every data-parallel
  tile (`all`) or of the lane default only (`default`); an item `act:TILES` overrides `--fp8-tiles` for that
  activation (`gelu:all,silu:default`: what tests/test_fp8_fuse_quant_gpu.py runs); `--fp8-fp16`: the fp16-output
  kernels of the fp8 production set (the unfused fp8 layers and the calibration's eager forward), `--fp8-fp16
  default` only the lane default's; `--fp8-residual`: the `fp16_res` variant (`oasr.scaled_mm_fp8_residual`) of
  the fp8 tiles the fc2 residual sites resolve to plus the lane default. `--acts '' --lnq none` leaves the int8
  kernels out.

  OASR_JIT_DIR=DIR python benchmarks/prebuild_fusion_kernels.py [--jobs 16] [--acts silu] [--lnq auto] [--int8-fp16]
"""
from __future__ import annotations

import argparse
import itertools

import torch

import oasr_ops  # noqa: F401  (registers the families)
from oasr_ops.codegen.variants import act_variant
from oasr_ops.codegen.jit import JitSpec, build_many
from oasr_ops.codegen.render_layer_norm_quant import THREADS_PER_ROW, VECS, LnqConfig
from oasr_ops.families.layer_norm_quant.kernels import spec_for
from oasr_ops.families.layer_norm_quant.ops import auto_config
from oasr_ops.families.scaled_mm.act_quant import select_act_quant_config
from oasr_ops.runtime import registry

# (N, K, M) of the FFN fc1 sites: Conformer M at B=16 x 10 s, Whisper small at B=8
ACT_SITES = ((2048, 512, 3984), (3072, 768, 12000))
# (N, K, M) of the FFN fc2 sites (the residual epilogue), the same models
RESIDUAL_SITES = ((512, 2048, 3984), (768, 3072, 12000))
LNQ_WIDTHS = (256, 512, 768, 1024)


FP8_TILES = ("sites", "all", "default")


def fp8_specs(acts: list[str], tiles: str, fp16: str | bool, residual: bool = False) -> list[JitSpec]:
    """The fp8 act-quant kernels (module docstring: `acts` items ``act`` or ``act:TILES``), the fp16 kernels
    `fp16` asks for (``production``/True, ``default``, ``none``/False) and, with `residual`, the fc2 sites'
    residual kernels."""
    from oasr_ops.families.scaled_mm_fp8.act_quant import select_act_quant_config
    from oasr_ops.families.scaled_mm_fp8.kernels import production_configs
    from oasr_ops.families.scaled_mm_fp8.residual import select_residual_config

    lane = registry.native_lane("sm90", "scaled_mm_fp8")

    def chosen(which: str) -> list[str]:
        if which == "all":
            return [c.id for c in lane.data_parallel()]
        if which == "default":
            return [lane.default.id]
        if which != "sites":
            raise SystemExit(f"--fp8-acts: tiles must be one of {FP8_TILES}, got {which!r}")
        return sorted({lane.default.id} | {select_act_quant_config(n, k, m, "sm90").config for n, k, m in ACT_SITES})

    out = []
    for item in acts:
        act, _, which = item.partition(":")
        out += [JitSpec.for_kernel(lane, lane.get(c), f"fp8_{act}", "sm90") for c in chosen(which or tiles)]
    if fp16 in (True, "production"):
        out += [JitSpec.for_kernel(lane, c, "fp16", "sm90") for c in production_configs("sm90")]
    elif fp16 == "default":
        out.append(JitSpec.for_kernel(lane, lane.default, "fp16", "sm90"))
    if residual:
        res = {lane.default.id} | {select_residual_config(n, k, m, "sm90").config for n, k, m in RESIDUAL_SITES}
        out += [JitSpec.for_kernel(lane, lane.get(c), "fp16_res", "sm90") for c in sorted(res & set(lane.ids()))]
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--acts", default="gelu,silu", help="activation variants to build (comma-separated)")
    p.add_argument("--lnq", choices=("all", "auto", "none"), default="all")
    p.add_argument("--fp8-acts", default="", help="fp8 activation variants to build (comma-separated)")
    p.add_argument("--fp8-tiles", choices=FP8_TILES, default="sites")
    p.add_argument("--fp8-fp16", nargs="?", const="production", default="none",
                   choices=("none", "default", "production"), help="also the fp16-output kernels of the fp8 production set (or of the lane default only)")
    p.add_argument("--fp8-residual", action="store_true",
                   help="also the fp16_res variant of the fp8 tiles of the fc2 sites (oasr.scaled_mm_fp8_residual)")
    p.add_argument("--int8-fp16", action="store_true", help="also the fp16-output variant of every int8 tile")
    p.add_argument("--residual", action="store_true", help="also the fp16_res variant of the fc2 sites' tiles")
    p.add_argument("--production", default="",
                   help="also these families' production sets, fp16 (comma-separated, e.g. conv1d,conv2d_activation: "
                        "the other oasr kernels the e2e graph loads); a family this checkout lacks is skipped")
    a = p.parse_args()
    if a.lnq == "all":
        specs = [spec_for(LnqConfig(t, v), dt, sch, "90a") for t, v in itertools.product(THREADS_PER_ROW, VECS)
                 for dt in (torch.float16, torch.bfloat16) for sch in ("int8", "fp8")]
    elif a.lnq == "none":
        specs = []
    else:
        configs = {auto_config(n) for n in LNQ_WIDTHS} - {None}
        schemes = ("int8", "fp8") if a.fp8_acts else ("int8",)  # fp8 runs with fuse_quantization=True use fp8's
        specs = [spec_for(c, torch.float16, sch, "90a") for c in sorted(configs, key=lambda c: c.id)
                 for sch in schemes]
    lane = registry.native_lane("sm90", "scaled_mm")
    ids = {lane.default.id} | {select_act_quant_config(n, k, m, "sm90").config for n, k, m in ACT_SITES}
    ids = {c for c in ids if c in lane.ids()}
    acts = [s for s in a.acts.split(",") if s]
    # fp32 bias (or none) and the fp16 models' bias the fusion pass passes as it is
    specs += [JitSpec.for_kernel(lane, lane.get(c), act_variant(act, bias), "sm90") for c in sorted(ids)
              for act in acts for bias in (None, "fp16")]
    if a.residual:
        from oasr_ops.families.scaled_mm.residual import select_residual_config

        res_ids = {lane.default.id} | {select_residual_config(n, k, m, "sm90").config for n, k, m in RESIDUAL_SITES}
        specs += [JitSpec.for_kernel(lane, lane.get(c), "fp16_res", "sm90") for c in sorted(res_ids & set(lane.ids()))]
    if a.int8_fp16:
        specs += [JitSpec.for_kernel(lane, c, "fp16", "sm90") for c in lane.space]
    for fam in (f for f in a.production.split(",") if f):
        try:
            prebuild = registry.get(fam).handler("prebuild_specs")
        except ValueError:
            print(f"no family {fam!r} here: skipped", flush=True)
            continue
        if prebuild is not None:
            specs += prebuild("sm90", all_=False, dtypes=("fp16",))
    specs += fp8_specs([s for s in a.fp8_acts.split(",") if s], a.fp8_tiles, a.fp8_fp16, a.fp8_residual)
    print(f"{len(specs)} kernels", flush=True)
    report = build_many(specs, jobs=a.jobs)
    print(report.summary())
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

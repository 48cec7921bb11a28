"""`oasr tune prebuild` (the production set) holds every kernel a served model can load on sm90, so a service that
prebuilt never runs nvcc on a request: for a grid of shapes, every runtime selection (plain, quantizing, act-quant,
residual GEMMs of int8 and fp8; the fused LayerNorms; the int8 frontend conv) names a kernel in the plan. And
`OASR_JIT_BUILD=off` makes a missing kernel an error the caller falls back from, instead of a compile."""
from __future__ import annotations

import pytest

import oasr_ops  # noqa: F401  (registers the families)
from oasr_ops.codegen.jit import BuildError, JitSpec
from oasr_ops.configs import SENTINELS, parse
from oasr_ops.runtime.registry import native_lane
from oasr_ops.tune.prebuild import plan_specs

ARCH = "sm90"
# (N, K) of ASR encoder GEMMs (d = 256 ... 1280, FFN x4, q/k/v fused and not) and M from one token to 64k rows
NK = [(n, k) for d in (256, 384, 512, 768, 1024, 1280) for n, k in ((d, d), (3 * d, d), (4 * d, d), (d, 4 * d),
                                                                      (2 * d, d))]
MS = (1, 7, 16, 17, 64, 127, 128, 1000, 3984, 4096, 12000, 16384, 65536)


@pytest.fixture(scope="module")
def planned() -> set[str]:
    return {s.name for s in plan_specs(ARCH, None, False, ("fp16", "bf16"))}


def _name(family: str, config: str, variant: str) -> str | None:
    if config in SENTINELS:
        return None
    return JitSpec.for_kernel(native_lane(ARCH, family), parse(config), variant, ARCH).name


def test_gemm_selections_graph_and_eager_are_prebuilt(planned):
    """The shipped gemm DB's answers, its region tables for graphs with CUDA graphs and without (``regions_eager``:
    tiles no graph region names) included, name prebuilt kernels."""
    from oasr_ops.runtime import select

    missing, eager_ids = set(), set()
    for (n, k) in NK:
        for op in ("gemm", "gemm_activation"):
            for eager in (False, True):
                table = select.region_table("gemm", op, "fp16", n, k, ARCH, eager=eager)
                ids = {c for _, c in table} | {select.select_config("gemm", op, "fp16", n, k, m, ARCH).config
                                               for m in MS}
                eager_ids |= ids if eager else set()
                missing |= {(n, k, op, c, v) for c in ids for v in ("fp16", "bf16")
                            if c != "auto" and (nm := _name("gemm", c, v)) and nm not in planned}
    assert not missing, sorted(missing)[:10]
    assert "t64x32x64_c1x1_pp" in eager_ids  # the grid reaches the eager tables' small tiles


def test_int8_selections_are_prebuilt(planned):
    from oasr_ops.families.scaled_mm import ops
    from oasr_ops.families.scaled_mm.act_quant import select_act_quant_config
    from oasr_ops.families.scaled_mm.residual import select_residual_config

    missing = set()
    for (n, k) in NK:
        for m in MS:
            wanted = [(ops.select_config(n, k, m, ARCH).config, v) for v in ("fp16", "bf16")]
            wanted.append((ops.select_quant_config(n, k, m, ARCH).config, "int8"))
            wanted += [(select_act_quant_config(n, k, m, ARCH).config, f"int8_{a}") for a in ("gelu", "silu")]
            wanted += [(select_residual_config(n, k, m, ARCH).config, f"{v}_res") for v in ("fp16", "bf16")]
            missing |= {(n, k, m, c, v) for c, v in wanted if (nm := _name("scaled_mm", c, v)) and nm not in planned}
    assert not missing, sorted(missing)[:10]


def test_fp8_selections_are_prebuilt(planned):
    from oasr_ops.families.scaled_mm_fp8 import ops
    from oasr_ops.families.scaled_mm_fp8.act_quant import select_act_quant_config

    missing = set()
    for (n, k) in NK:
        for m in MS:
            plain = ops.select_config(n, k, m, ARCH).config
            quant = ops.select_quant_config(n, k, m, ARCH).config
            wanted = [(plain, "bf16"), (ops.heuristic_where_torch(plain, m, n, k, ARCH), "fp16"),
                      (ops.heuristic_where_torch(quant, m, n, k, ARCH), "fp8")]
            wanted += [(select_act_quant_config(n, k, m, ARCH).config, f"fp8_{a}") for a in ("gelu", "silu")]
            missing |= {(n, k, m, c, v) for c, v in wanted
                        if (nm := _name("scaled_mm_fp8", c, v)) and nm not in planned}
    assert not missing, sorted(missing)[:10]


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_layer_norm_quant_auto_configs_are_prebuilt(planned, scheme):
    import torch

    from oasr_ops.families.layer_norm_quant.kernels import spec_for
    from oasr_ops.families.layer_norm_quant.ops import auto_config

    served = {auto_config(n) for n in range(8, 8193, 8)} - {None}
    assert served  # the table serves some width: the check below is not vacuous
    for dt in (torch.float16, torch.bfloat16):
        missing = [c.id for c in served if spec_for(c, dt, scheme, "90a").name not in planned]
        assert not missing, (dt, missing)


def test_int8_conv_untuned_tiles_are_prebuilt(planned):
    from oasr_ops.families.conv2d_activation.lanes import SM90_INT8_CONV2D
    from oasr_ops.families.conv2d_activation.ops_int8 import untuned_tile

    tiles = {untuned_tile(c) for c in range(8, 4097, 8)}
    assert len(tiles) > 1  # the rule has more than one answer over these widths
    for t in tiles:
        for v in ("int8_fp16", "int8_bf16"):
            name = JitSpec.for_kernel(SM90_INT8_CONV2D, SM90_INT8_CONV2D.get(t), v, ARCH).name
            assert name in planned, name


def test_conv2d_untuned_answers_are_prebuilt(planned):
    """Every config the frontend conv's untuned rule answers — the direct kernel's default and, at large M (a B=16 x
    20 s batch), `DIRECT_LARGE` — is prebuilt in fp16/bf16 and in the int8-output variant an int8 frontend runs."""
    from oasr_ops.families.conv2d_activation.ops import untuned_config

    lane = native_lane(ARCH, "conv2d_activation")
    answers = {untuned_config(lane, m, n, k, ARCH) for m in (1, 977, 20_000, 1 << 17, 640_000, 4_000_000)
               for n in (64, 128, 256, 512) for k in (9, 18, 36, 72, 288)}
    kernels = answers - set(SENTINELS)
    assert len(kernels) > 1  # the rule answers more than one kernel over this grid: the check is not vacuous
    missing = [(c, v) for c in kernels for v in ("fp16", "bf16", "fp16_q8", "bf16_q8")
               if _name("conv2d_activation", c, v) not in planned]
    assert not missing, missing


def test_census_plans_stay_plain():
    """A tuning build's exact candidates (`configs=`) do not drag the fused variants along: the build measures the
    plain kernels only."""
    from oasr_ops.runtime.registry import get

    lane = native_lane(ARCH, "scaled_mm")
    specs = get("scaled_mm").handler("prebuild_specs")(ARCH, False, ("fp16",), configs=[lane.default])
    assert {s.dtype for s in specs} == {"fp16", "int8"}


def test_no_on_demand_build_when_forbidden(monkeypatch, tmp_path):
    """OASR_JIT_BUILD=off: loading an absent kernel raises BuildError naming the switch, and nvcc never runs."""
    from oasr_ops.codegen import jit

    monkeypatch.setenv("OASR_JIT_DIR", str(tmp_path / "jit"))
    monkeypatch.setenv("OASR_JIT_BUILD", "off")
    called = []
    monkeypatch.setattr(jit.JitSpec, "_compile", lambda self, out, jdir: called.append(self.name))
    lane = native_lane(ARCH, "scaled_mm")
    spec = JitSpec.for_kernel(lane, lane.default, "fp16", ARCH)
    before = jit.compiled_in_process()
    with pytest.raises(BuildError, match="OASR_JIT_BUILD=off"):
        spec.load()
    assert called == [] and jit.compiled_in_process() == before
    monkeypatch.setenv("OASR_JIT_BUILD", "on")
    assert jit.on_demand_builds_allowed()

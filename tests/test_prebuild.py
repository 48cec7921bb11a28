"""`oasr tune prebuild` plans the production set of both kernel families without a GPU."""
from oasr_ops.families.gemm.kernels import production_configs
from oasr_ops.runtime.registry import get_lane
from oasr_ops.tune.prebuild import plan_specs


def test_plan_covers_every_family(monkeypatch, tmp_path):
    from oasr_ops import paths
    from oasr_ops.tune import database

    monkeypatch.setattr(paths, "system_db_dir", lambda: tmp_path)  # no DB: defaults, coverage, ladder rungs
    database.reload()
    try:
        gemm = plan_specs("sm90", None, False, ("fp16",), "gemm")
        smm = plan_specs("sm90", None, False, ("fp16",), "scaled_mm")
        bmm = plan_specs("sm90", None, False, ("fp16",), "bmm")
        conv = plan_specs("sm90", None, False, ("fp16",), "conv1d")
        fp8 = plan_specs("sm90", None, False, ("fp16",), "scaled_mm_fp8")
        conv2d = plan_specs("sm90", None, False, ("fp16",), "conv2d_activation")
        both = plan_specs("sm90", None, False, ("fp16",))
        bmm_lane = get_lane("sm90_f16_wgmma_bmm")
        sm90 = get_lane("sm90_f16_wgmma")
        expected = {c.kernel_key() for c in production_configs(sm90, "sm90")}
    finally:
        monkeypatch.undo()
        database.reload()
    assert {s.lane.name for s in gemm} == {"sm90_f16_wgmma", "sm80_f16_mma"}
    # the quantized families bring their fused LayerNorm producer's kernels (no lane: not a family of its own)
    lnq = {"int8": [s for s in smm if s.lane is None], "fp8": [s for s in fp8 if s.lane is None]}
    assert {s.dtype for s in lnq["int8"]} == {"fp16_int8"} and {s.dtype for s in lnq["fp8"]} == {"fp16_fp8"}
    smm, fp8 = [s for s in smm if s.lane is not None], [s for s in fp8 if s.lane is not None]
    assert {s.lane.name for s in smm} == {"sm90_int8_wgmma"}
    # and the fused epilogues of every data-parallel tile: act-quant (int8 / e4m3 out) and residual (both)
    dp = {s.config for s in smm if s.dtype == "int8"}
    assert {s.config for s in smm if s.dtype in ("int8_gelu", "int8_silu", "fp16_res")} == dp
    dp8 = {s.config for s in fp8 if s.dtype == "fp8"}
    assert {s.config for s in fp8 if s.dtype in ("fp8_gelu", "fp8_silu", "fp16_res")} == dp8
    assert {s.lane.name for s in bmm} == {"sm90_f16_wgmma_bmm"}
    # no DB: the bmm lane's default and coverage basis, each in both B layouts
    assert {(s.config, s.dtype) for s in bmm} == {(c, f"fp16_b{mj}") for c in (bmm_lane.default,
                                                                                *bmm_lane.coverage_basis)
                                                  for mj in ("k", "n")}
    assert {s.lane.name for s in conv} == {"sm80_f16_dwconv"}
    assert {s.lane.name for s in fp8} == {"sm90_fp8_wgmma"}
    # no DB: the lane default, coverage basis and every heuristic tile; fp16 and, data-parallel, fp8 output
    assert {s.dtype for s in fp8} == {"fp16", "fp8", "fp8_gelu", "fp8_silu", "fp16_res"}
    assert all(s.config.kernel_schedule != "streamk" for s in fp8 if s.dtype == "fp8")
    # no DB: the conv2d lane's default (direct conv) and coverage basis (a CUTLASS implicit GEMM), and the int8
    # frontend's kernels: the direct default's int8-output variant and the int8 conv lane's default tile
    assert {(s.lane.name, s.config.generation, s.dtype) for s in conv2d} == {
        ("sm90_f16_conv2d", "dc", "fp16"), ("sm90_f16_conv2d", "3x", "fp16"), ("sm90_f16_conv2d", "dc", "fp16_q8"),
        ("sm90_int8_conv2d", "3x", "int8_fp16")}
    assert len({s.config for s in conv2d if s.lane.name == "sm90_int8_conv2d"}) == 2  # both untuned_tile answers
    assert len(both) == (len(gemm) + len(smm) + len(bmm) + len(conv) + len(fp8) + len(conv2d)
                         + len(lnq["int8"]) + len(lnq["fp8"]))
    assert {s.config for s in gemm if s.lane is sm90} == expected == {sm90.default, *sm90.coverage_basis}
    assert all(s.config.kernel_schedule != "streamk" for s in smm if s.dtype == "int8")
    assert [s.est_memory for s in both] == sorted((s.est_memory for s in both), reverse=True)


def test_all_and_explicit_configs():
    allp = plan_specs("sm90", None, True, ("fp16", "bf16"), "gemm")
    assert len(allp) == 2 * (19 + 8)  # split-K variants share their kernel
    one = plan_specs("sm90", ["t64x64x64_c1x1_pp"], False, ("fp16",))
    assert [s.name for s in one] == ["sm90_f16_wgmma_t64x64x64_c1x1_pp_fp16_sm90a"]


def test_census_plan_is_what_the_build_loads(monkeypatch, tmp_path):
    """`prebuild --census`: per signature the union over the build's points of the arms it keeps there (pruned by
    the cost model), each family's tiles, in the signature's dtype; --no-prune: every feasible config."""
    import json

    from oasr_ops import paths
    from oasr_ops.tune import database
    from oasr_ops.tune.build import BuildOptions, arm_plan, load_works, plan_signature
    from oasr_ops.tune.candidates import candidates_for, parts_of
    from oasr_ops.tune.prebuild import census_plan

    sig = "gemm|op=gemm|dt=bf16|N=1024|K=1024"
    census = tmp_path / "c.json"
    census.write_text(json.dumps({"signatures": {
        sig: {"points": [{"m": 8, "weight": 1.0}, {"m": 40, "weight": 1.0}]},
        "bmm|op=bmm|dt=half|N=64|K=64": {"points": [{"m": 16, "weight": 1.0}]}}}))
    monkeypatch.setattr(paths, "system_db_dir", lambda: tmp_path / "db")  # no tuning file: no calibration
    database.reload()
    try:
        opts = BuildOptions(top_k=2, max_fill=1)
        plan = census_plan([str(census)], "sm90", opts=opts)
        full = census_plan([str(census)], "sm90", opts=BuildOptions(prune=False, max_fill=1))
        only_bmm = census_plan([str(census)], "sm90", "bmm", opts=opts)
        specs = plan_specs("sm90", None, False, ("fp16",), "gemm", [str(census)], opts)
        work = load_works([str(census)], "gemm")[sig]
        pts = plan_signature(work, opts)
        want = {c for ids in arm_plan(sig, pts, opts, "sm90").values() for c in ids} - {"torch"}
    finally:
        monkeypatch.undo()
        database.reload()
    lane = get_lane("sm90_f16_wgmma")
    # the int8 family measures the quantizable gemm site too (census_from), every tile (it is not modelled)
    # and the fp8 family, in bf16 (its measure_dtype: the torch arm is torch._scaled_mm rowwise, bf16 out) and
    # fp16 (its gate_dtypes: the gates also run fp16 output, which the dtype-less DB serves too)
    assert set(plan) == {("gemm", "bf16"), ("bmm", "fp16"), ("scaled_mm", "fp16"), ("scaled_mm_fp8", "bf16"),
                         ("scaled_mm_fp8", "fp16")}
    fp8 = {c.id for c in candidates_for(parts_of("scaled_mm_fp8|op=scaled_mm_fp8|N=1024|K=1024"), "sm90")}
    assert set(plan[("scaled_mm_fp8", "bf16")]) == set(plan[("scaled_mm_fp8", "fp16")]) == fp8 - {"heuristic", "torch"}
    assert set(only_bmm) == {("bmm", "fp16")}
    smm = {c.id for c in candidates_for(parts_of("scaled_mm|op=scaled_mm|N=1024|K=1024"), "sm90")} - {"heuristic"}
    assert set(plan[("scaled_mm", "fp16")]) == smm
    assert set(plan[("gemm", "bf16")]) == want
    assert lane.default.id in want and len(want) < len(full[("gemm", "bf16")])
    feasible = {c.id for c in candidates_for(parts_of(sig), "sm90")} - {"torch"}
    assert set(full[("gemm", "bf16")]) == feasible  # the no-prune build loads every feasible config
    assert {(s.config.id, s.dtype) for s in specs} == {(c, "bf16") for c in want}  # dtype from the signature
    assert [p.m for p in pts if p.validation]  # the validation points are planned (and pruned) too

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
        both = plan_specs("sm90", None, False, ("fp16",))
        bmm_lane = get_lane("sm90_f16_wgmma_bmm")
        sm90 = get_lane("sm90_f16_wgmma")
        expected = {c.kernel_key() for c in production_configs(sm90, "sm90")}
    finally:
        monkeypatch.undo()
        database.reload()
    assert {s.lane.name for s in gemm} == {"sm90_f16_wgmma", "sm80_f16_mma"}
    assert {s.lane.name for s in smm} == {"sm90_int8_wgmma"}
    assert {s.lane.name for s in bmm} == {"sm90_f16_wgmma_bmm"}
    # no DB: the bmm lane's default and coverage basis, each in both B layouts
    assert {(s.config, s.dtype) for s in bmm} == {(c, f"fp16_b{mj}") for c in (bmm_lane.default,
                                                                                *bmm_lane.coverage_basis)
                                                  for mj in ("k", "n")}
    assert {s.lane.name for s in conv} == {"sm80_f16_dwconv"}
    assert len(both) == len(gemm) + len(smm) + len(bmm) + len(conv)
    assert {s.config for s in gemm if s.lane is sm90} == expected == {sm90.default, *sm90.coverage_basis}
    assert all(s.config.kernel_schedule != "streamk" for s in smm if s.dtype == "int8")
    assert [s.est_memory for s in both] == sorted((s.est_memory for s in both), reverse=True)


def test_all_and_explicit_configs():
    allp = plan_specs("sm90", None, True, ("fp16", "bf16"), "gemm")
    assert len(allp) == 2 * (19 + 8)  # split-K variants share their kernel
    one = plan_specs("sm90", ["t64x64x64_c1x1_pp"], False, ("fp16",))
    assert [s.name for s in one] == ["sm90_f16_wgmma_t64x64x64_c1x1_pp_fp16_sm90a"]

"""The tuning database: tiers, region semantics, validators, re-stamping, epochs, hostile files, status/diff.

Real files in tmp_path; the system tier is pointed at tmp_path by replacing `paths.system_db_dir` (the only
thing patched), the user tier through OASR_TUNE_USER_DB as a user would.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
import warnings

import pytest

from oasr_ops.configs import parse
from oasr_ops.runtime import arch as arch_mod
from oasr_ops.tune import database as db
from oasr_ops.tune import status as status_mod
from oasr_ops.runtime import validators as val

LANE = "sm90_f16_wgmma"
A, B, C, D = "t64x64x64_c1x1_pp", "t128x128x64_c1x1_coop", "t64x128x64_c1x1_pp", "t128x256x64_c1x1_coop"
SK = "t128x128x128_c1x1_sk"  # an sm90_int8_wgmma Stream-K tile (the scaled_mm tests use it)
NOT_IN_LANE = "t64x64x64_c1x1_pp_a4"  # parses, but the lane has no alignment-4 variant
SIG = "gemm|op=gemm|dt=half|N=512|K=256"
SIG2 = "gemm|op=gemm|dt=half|N=1024|K=256"


@pytest.fixture
def env(tuning_env):
    return tuning_env


def write_db(root, family, entries, *, arch="sm90", lane=LANE, validators=None, configs=None, **extra):
    doc = {"schema": 2, "kernel_family": family, "arch_family": arch, "lane": lane,
           "validators": val.current_soft_validators(lane) if validators is None else validators,
           "configs": configs or {}, "entries": entries, **extra}
    p = root / arch / f"{family}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc))
    return p


def look(m, sig_dtype="fp16", n=512, k=256, family="gemm", op="gemm"):
    return db.lookup(family, op, sig_dtype, n, k, m, "sm90")


def recorded():
    ctx = warnings.catch_warnings(record=True)
    w = ctx.__enter__()
    warnings.simplefilter("always")
    return ctx, w


# ----------------------------------------------------------------------------------------------- basics


def test_signature_strings():
    assert db.signature("gemm", "gemm", "half", 512, 256) == SIG
    assert db.signature("gemm", "gemm_activation", "bf16", 512, 256) == "gemm|op=gemm_activation|dt=bf16|N=512|K=256"
    assert db.signature("scaled_mm", "scaled_mm", "int8", 768, 256) == "scaled_mm|op=scaled_mm|N=768|K=256"
    assert db.signature("scaled_mm", "scaled_mm_quant", None, 768, 256) == "scaled_mm|op=scaled_mm_quant|N=768|K=256"
    assert db.parse_signature(SIG) == db.SigParts("gemm", "gemm", "half", 512, 256)
    for bad in ("gemm|op=gemm|dt=half|N=0512|K=256", "gemm|op=scaled_mm|dt=half|N=1|K=1",
                "scaled_mm|op=scaled_mm|dt=half|N=1|K=1", "gemm|op=gemm|N=1|K=1", 5, None, "x" * 10000):
        assert db.parse_signature(bad) is None
    with pytest.raises(ValueError):
        db.signature("gemm", "bmm", "half", 1, 1)
    with pytest.raises(ValueError):
        db.signature("gemm", "gemm", "half", 0, 1)


def test_round_up_and_catch_all(env):
    write_db(env.system, "gemm", {SIG: {"regions": [[512, A], [2048, B], [None, "torch"]]}})
    db.reload()
    assert look(1) == (A, "system")
    assert look(512) == (A, "system")
    assert look(513) == (B, "system")
    assert look(2048) == (B, "system")
    assert look(2049) == ("torch", "system")
    assert look(10**9) == ("torch", "system")


def test_autotune_entry_without_catch_all_falls_through_to_system(env):
    write_db(env.user, "gemm", {SIG: {"regions": [[256, C]], "source": "autotune"}})
    write_db(env.system, "gemm", {SIG: {"regions": [[512, A], [None, B]]}})
    db.reload()
    assert look(100) == (C, "user")
    assert look(256) == (C, "user")
    assert look(257) == (A, "system")
    assert look(100000) == (B, "system")


def test_uncovered_is_none(env):
    write_db(env.system, "gemm", {SIG: {"regions": [[64, A]]}})
    db.reload()
    assert look(65) is None
    assert look(1, n=1024) is None


def test_user_wins_per_signature(env):
    write_db(env.user, "gemm", {SIG: {"regions": [[None, C]]}})
    write_db(env.system, "gemm", {SIG: {"regions": [[None, A]]}, SIG2: {"regions": [[None, B]]}})
    db.reload()
    assert look(10) == (C, "user")
    assert look(10, n=1024) == (B, "system")


def test_dtype_precedence(env):
    write_db(env.system, "gemm", {
        SIG: {"regions": [[None, A]]},
        "gemm|op=gemm|dt=fp16|N=512|K=256": {"regions": [[128, B]]},
        "gemm|op=gemm|dt=bf16|N=512|K=256": {"regions": [[None, D]]},
    })
    db.reload()
    assert look(64, "fp16") == (B, "system")
    assert look(129, "fp16") == (A, "system")  # the fp16 entry does not cover 129: dt=half answers
    assert look(64, "bf16") == (D, "system")
    assert look(64, "half") == (A, "system")
    import torch

    assert look(64, torch.float16) == (B, "system")
    assert look(64, torch.bfloat16) == (D, "system")
    assert look(64, "fp32") is None


def test_user_half_beats_system_specific(env):
    write_db(env.user, "gemm", {SIG: {"regions": [[None, C]]}})
    write_db(env.system, "gemm", {"gemm|op=gemm|dt=fp16|N=512|K=256": {"regions": [[None, B]]}})
    db.reload()
    assert look(1, "fp16") == (C, "user")


def test_conv1d_exact_points_and_regions(env):
    sig = "conv1d|op=conv1d|dt=half|N=384|K=1152"
    A, B, C = "dw32x64_v8_n256", "dw64x64_v8_n256", "dw64x32_v16_n128"  # the depthwise lane's ids
    write_db(env.system, "conv1d", {sig: {"points": {"1x3000": A, "2x3000": C}},
                                     "conv1d|op=conv1d|dt=half|N=512|K=1536": {"regions": [[4096, B]]}},
             lane="sm80_f16_dwconv")
    db.reload()
    lf = db.get_file("system", "sm90", "conv1d")
    e = lf.entries[sig]
    assert e.lookup_point(1, 3000) == A
    assert e.lookup_point(2, 3000) == C
    assert e.lookup_point(1, 2999) is None  # exact points only: no rounding
    e2 = lf.entries["conv1d|op=conv1d|dt=half|N=512|K=1536"]
    assert e2.lookup_point(2, 1500, m=2 * 1498) == B
    assert e2.lookup_point(4, 1500) is None  # M = 6000 > 4096


def test_user_db_off_and_dir(env, monkeypatch, tmp_path):
    write_db(env.user, "gemm", {SIG: {"regions": [[None, C]]}})
    write_db(env.system, "gemm", {SIG: {"regions": [[None, A]]}})
    db.reload()
    assert look(1) == (C, "user")
    monkeypatch.setenv("OASR_TUNE_USER_DB", "off")
    assert look(1) == (C, "user")  # the environment is read at reload time, not per lookup
    db.reload()
    assert look(1) == (A, "system")
    assert db.tier_dirs()["user"] is None
    other = tmp_path / "elsewhere"
    write_db(other, "gemm", {SIG: {"regions": [[None, D]]}})
    monkeypatch.setenv("OASR_TUNE_USER_DB", str(other))
    db.reload()
    assert look(1) == (D, "user")


def test_epochs(env):
    p = write_db(env.system, "gemm", {SIG: {"regions": [[None, A]]}})
    db.reload()
    e0 = db.epoch()
    assert look(1) == (A, "system")
    h0 = db.snapshot_hash()
    write_db(env.system, "gemm", {SIG: {"regions": [[None, B]]}})
    assert look(1) == (A, "system")
    assert db.snapshot_hash() == h0
    p.unlink()
    assert look(1) == (A, "system")
    write_db(env.system, "gemm", {SIG: {"regions": [[None, B]]}})
    assert db.reload() == e0 + 1 == db.epoch()
    assert look(1) == (B, "system")
    assert db.snapshot_hash() != h0
    db.reload()
    assert db.snapshot_hash() == db.snapshot_hash()


# ------------------------------------------------------------------------------------------- validators


@pytest.mark.parametrize("field,value", [("schema", 1), ("schema", "2"), ("kernel_family", "scaled_mm"),
                                         ("arch_family", "sm80"), ("lane", "sm80_f16_mma"), ("lane", None)])
def test_hard_mismatch_skips_file_with_one_warning(env, field, value):
    p = write_db(env.system, "gemm", {SIG: {"regions": [[None, A]]}})
    doc = json.loads(p.read_text())
    doc[field] = value
    p.write_text(json.dumps(doc))
    db.reload()
    ctx, w = recorded()
    try:
        assert look(1) is None
        assert look(2) is None
        db.report()
    finally:
        ctx.__exit__(None, None, None)
    msgs = [str(x.message) for x in w if issubclass(x.category, db.TuningDBWarning)]
    assert len(msgs) == 1 and "hard validator mismatch" in msgs[0] and field in msgs[0]
    rep = db.report()
    assert [f["status"] for f in rep["files"]] == ["skipped"]


@pytest.mark.parametrize("key", val.SOFT_KEYS)
def test_soft_mismatch_marks_stale(env, monkeypatch, key):
    if key == "sku":  # no GPU here: give this process a SKU so there is something to compare
        monkeypatch.setattr(arch_mod, "gpu_sku", lambda: "NVIDIA H200")
        db.reload()
    cur = val.current_soft_validators(LANE)
    if cur[key] is None:
        pytest.skip(f"{key} unknown on this machine")
    write_db(env.system, "gemm", {SIG: {"regions": [[None, A]]}}, validators={**cur, key: "something-else"})
    db.reload()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a soft mismatch warns about nothing: the file stays in service
        assert look(1) == (A, "system")
    stale = db.report()["stale"]
    assert [(s["signature"], s["validators"]) for s in stale] == [(SIG, [key])]


def test_unknown_current_value_is_not_a_mismatch(env):
    cur = val.current_soft_validators(LANE)
    assert cur["sku"] is None  # the CPU box
    write_db(env.system, "gemm", {SIG: {"regions": [[None, A]]}}, validators={**cur, "sku": "NVIDIA H200"})
    db.reload()
    assert db.report()["stale"] == []


def test_restamp_keeps_older_entries_validators(env):
    cur = val.current_soft_validators(LANE)
    old = {**cur, "impl": "old-impl", "nvcc": "V12.0"}
    p = write_db(env.user, "gemm", {SIG: {"regions": [[None, A]], "source": "aot"}}, validators=old)
    db.publish("gemm", {SIG2: {"regions": [[None, B]], "source": "aot"}})
    doc = json.loads(p.read_text())
    assert doc["validators"] == cur
    assert doc["entries"][SIG]["soft"] == old
    assert "soft" not in doc["entries"][SIG2]
    db.reload()
    stale = {s["signature"]: s["validators"] for s in db.report()["stale"]}
    assert SIG2 not in stale
    assert "impl" in stale[SIG] and ("nvcc" in stale[SIG] or cur["nvcc"] is None)
    # a third write keeps the entry's own validators, not the previous file stamp
    db.publish("gemm", {"gemm|op=gemm|dt=half|N=64|K=64": {"regions": [[None, C]]}})
    doc = json.loads(p.read_text())
    assert doc["entries"][SIG]["soft"] == old and "soft" not in doc["entries"][SIG2]


def test_mixed_entry_stays_stale_until_rebuilt(env):
    cur = val.current_soft_validators(LANE)
    old = {**cur, "impl": "old-impl"}
    p = write_db(env.user, "gemm", {SIG: {"regions": [[512, A]], "evidence": {"M=512": 1}, "notes": ["a"]}},
                 validators=old)
    db.publish("gemm", {SIG: {"regions": [[1024, B]], "evidence": {"M=1024": 2}, "notes": ["b"]}},
               merge_regions=True)
    e = json.loads(p.read_text())["entries"][SIG]
    assert e["regions"] == [[512, A], [1024, B]]
    assert e["evidence"] == {"M=512": 1, "M=1024": 2} and e["notes"] == ["a", "b"]
    assert e["soft"] == old
    db.reload()
    assert look(600) == (B, "user") and look(100) == (A, "user")
    assert {s["signature"] for s in db.report()["stale"]} == {SIG}
    db.publish("gemm", {SIG: {"regions": [[2048, C]]}})  # a rebuild replaces the entry: fresh
    e = json.loads(p.read_text())["entries"][SIG]
    assert e == {"regions": [[2048, C]]}
    db.reload()
    assert db.report()["stale"] == []


def test_unstamped_file_is_stale(env):
    write_db(env.system, "gemm", {SIG: {"regions": [[None, A]]}}, validators={})
    db.reload()
    assert db.report()["stale"][0]["validators"][0] == "impl"


# ---------------------------------------------------------------------------------------------- writers


def test_publish_fills_configs_and_replaces_when_fresh(env):
    p = db.publish("gemm", {SIG: {"regions": [[512, A], [None, "torch"]]}, SIG2: {"regions": [[None, B]]}})
    assert p == env.user / "sm90" / "gemm.json"
    doc = json.loads(p.read_text())
    assert set(doc["configs"]) == {A, B}
    assert doc["configs"][A] == parse(A).to_dict()
    assert (doc["schema"], doc["kernel_family"], doc["arch_family"], doc["lane"]) == (2, "gemm", "sm90", LANE)
    db.publish("gemm", {SIG: {"regions": [[None, C]]}}, fresh=True)
    doc = json.loads(p.read_text())
    assert list(doc["entries"]) == [SIG] and set(doc["configs"]) == {C}
    assert not [f for f in os.listdir(p.parent) if f.endswith(".tmp")]


def test_publish_tiers_and_errors(env, monkeypatch, tmp_path):
    d = db.publish("gemm", {SIG: {"regions": [[None, A]]}}, tier=tmp_path / "x", arch="9.0a")
    assert d == tmp_path / "x" / "sm90" / "gemm.json"
    db.publish("gemm", {SIG: {"regions": [[None, "b128x128x32_w64x64x32_s4"]]}}, tier=tmp_path / "y", arch="sm80")
    with pytest.raises(ValueError):
        db.publish("gemm", {SIG: {"regions": [[None, "../../x;rm -rf"]]}})
    with pytest.raises(ValueError):
        db.publish("gemm", {SIG: {"regions": [[None, NOT_IN_LANE]]}})
    with pytest.raises(ValueError):
        db.publish("gemm", {"scaled_mm|op=scaled_mm|N=8|K=8": {"regions": [[None, A]]}})
    with pytest.raises(ValueError):
        db.publish("gemm", {SIG: {"regions": [[None, A]]}}, configs={A: parse(B).to_dict()})
    with pytest.raises(ValueError):
        db.publish("nope", {})
    monkeypatch.setenv("OASR_TUNE_USER_DB", "off")
    with pytest.raises(RuntimeError):
        db.publish("gemm", {SIG: {"regions": [[None, A]]}})


def test_publish_does_not_change_this_epoch(env):
    write_db(env.system, "gemm", {SIG: {"regions": [[None, A]]}})
    db.reload()
    assert look(1) == (A, "system")
    db.publish("gemm", {SIG: {"regions": [[None, C]]}})
    assert look(1) == (A, "system")
    db.reload()
    assert look(1) == (C, "user")


# ------------------------------------------------------------------------------------- narrow skipping


def test_bad_regions_are_holes_falling_through(env):
    write_db(env.user, "gemm", {SIG: {"regions": [[128, A], [256, "../../x;rm -rf"], [512, NOT_IN_LANE],
                                                  [1024, C], [900, D], [-5, A], [2048.0, A], [4096, B]]},
                                SIG2: "not an object", "garbage|sig": {"regions": []}})
    write_db(env.system, "gemm", {SIG: {"regions": [[None, "torch"]]}})
    db.reload()
    ctx, w = recorded()
    try:
        assert look(100) == (A, "user")
        assert look(200) == ("torch", "system")  # bad id: its interval falls through
        assert look(300) == ("torch", "system")  # not in the lane
        assert look(1000) == (C, "user")
        assert look(3000) == (B, "user")  # out-of-order, negative and float m_hi were dropped
        assert look(5000) == ("torch", "system")
        assert look(1, n=1024) is None
        db.report()
    finally:
        ctx.__exit__(None, None, None)
    msgs = [str(x.message) for x in w]
    assert len(msgs) == 1 and "7 problem(s)" in msgs[0] and "(+4 more)" in msgs[0], msgs  # one per file
    problems = db.report()["files"][0]["problems"]
    assert len(problems) == 7


def test_configs_table_disagreement_skips_region(env):
    write_db(env.user, "gemm", {SIG: {"regions": [[512, A], [None, B]]}}, configs={A: parse(C).to_dict()})
    write_db(env.system, "gemm", {SIG: {"regions": [[None, D]]}})
    db.reload()
    with pytest.warns(db.TuningDBWarning, match="disagree"):
        assert look(1) == (D, "system")
    assert look(600) == (B, "user")


def test_streamk_never_served_for_quant(env):
    sigq, sig = "scaled_mm|op=scaled_mm_quant|N=768|K=256", "scaled_mm|op=scaled_mm|N=768|K=256"
    write_db(env.system, "scaled_mm", {sigq: {"regions": [[None, SK]]}, sig: {"regions": [[None, SK]]}},
             lane="sm90_int8_wgmma")
    db.reload()
    with pytest.warns(db.TuningDBWarning, match="Stream-K"):
        assert db.lookup("scaled_mm", "scaled_mm_quant", "int8", 768, 256, 1, "sm90") is None
    assert db.lookup("scaled_mm", "scaled_mm", "int8", 768, 256, 1, "sm90") == (SK, "system")


def test_huge_file_is_skipped_without_reading(env):
    p = env.system / "sm90" / "gemm.json"
    p.parent.mkdir(parents=True)
    with open(p, "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GB of nothing
    db.reload()
    with pytest.warns(db.TuningDBWarning, match="cap"):
        assert look(1) is None


def test_unreadable_file(env):
    p = write_db(env.system, "gemm", {SIG: {"regions": [[None, A]]}})
    p.chmod(0)
    if os.access(p, os.R_OK):
        pytest.skip("running as root: permissions are not enforced")
    db.reload()
    try:
        with pytest.warns(db.TuningDBWarning, match="unreadable"):
            assert look(1) is None
    finally:
        p.chmod(0o644)


# ---------------------------------------------------------------------------------------- status / diff


def _cli(argv):
    from oasr_ops import cli

    return cli.main(["tune", *argv])  # the CLI's one error path: UsageError -> one line, exit 2


def test_status_cli(env, capsys):
    cur = val.current_soft_validators(LANE)
    write_db(env.user, "gemm", {SIG: {"regions": [[None, A]]}}, validators={**cur, "impl": "x"})
    p = write_db(env.system, "gemm", {SIG: {"regions": [[None, A]]}})
    doc = json.loads(p.read_text())
    doc["lane"] = "sm80_f16_mma"
    p.write_text(json.dumps(doc))
    db.reload()
    with pytest.warns(db.TuningDBWarning):
        assert _cli(["status", "--arch", "sm90", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {f["status"] for f in out["files"]} == {"loaded", "skipped"}
    assert out["stale"][0]["validators"] == ["impl"]
    assert _cli(["status"]) == 0
    text = capsys.readouterr().out
    assert "SKIPPED" in text and "impl differ" in text


def test_diff_cli(env, tmp_path, capsys):
    a = db.publish("gemm", {SIG: {"regions": [[512, A], [None, B]], "evidence": {"M=512": [1.0]}},
                            SIG2: {"regions": [[None, B]]}}, tier=tmp_path / "a")
    b = db.publish("gemm", {SIG: {"regions": [[512, C], [1024, A], [None, B]], "evidence": {"M=512": [0.9]}},
                            "gemm|op=gemm|dt=half|N=8|K=8": {"regions": [[None, B]]}}, tier=tmp_path / "b")
    assert _cli(["diff", str(a), str(a)]) == 0
    capsys.readouterr()
    assert _cli(["diff", str(a), str(b), "--json"]) == 1
    d = json.loads(capsys.readouterr().out)["signatures"]
    assert d[SIG]["regions_changed"] == {"512": [A, C]}
    assert d[SIG]["regions_added"] == {"1024": A}
    assert d[SIG]["evidence"]["changed"] == {"M=512": [[1.0], [0.9]]}
    assert d[SIG2] == {"entry": "removed"} and d["gemm|op=gemm|dt=half|N=8|K=8"]["entry"] == "added"
    assert _cli(["diff", str(a), str(b)]) == 1
    assert "~ m_hi 512" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text("[1,")
    assert _cli(["diff", str(a), str(bad)]) == 2


def test_impl_hash_follows_the_rendered_kernels(monkeypatch):
    import dataclasses

    from oasr_ops.runtime import registry

    val.impl_hash.cache_clear()
    a = val.impl_hash("sm80_f16_mma")
    assert a == val.impl_hash("sm80_f16_mma") != val.impl_hash("sm90_f16_wgmma")
    spec = registry.get("gemm")
    real = spec.render  # the renderer the family hands the registry (codegen's)
    changed = dataclasses.replace(spec, render=lambda lane, c, dt: real(lane, c, dt) + "// changed\n")
    monkeypatch.setitem(registry._FAMILIES, "gemm", changed)
    val.impl_hash.cache_clear()
    assert val.impl_hash("sm80_f16_mma") != a  # any change to a kernel's source (templates, includes) counts
    monkeypatch.undo()
    val.impl_hash.cache_clear()


def test_every_lane_hashes_its_rendered_kernels_not_the_template_files(monkeypatch):
    """The impl validator renders every kernel of every lane in each of its family's `impl_variants`; before
    session 23, bmm and conv1d rendered an 'fp16' variant their renderers refuse, and the hash fell back to every
    template file of the package, so an edit of any family's template staled their DB files (the shipped
    conv1d.json was 'impl differ' after conv2d and layer_norm_quant template edits)."""
    import dataclasses

    from oasr_ops.runtime import registry

    for name, lane in registry.lanes().items():
        spec = registry.get(lane.family)
        for cfg in {c.kernel_key().id: c for c in lane.space}.values():
            for variant in spec.impl_variants:
                assert spec.render(lane, cfg, variant), (name, cfg.id, variant)
    # an edit of another family's kernels leaves conv1d's and bmm's hashes alone
    val.impl_hash.cache_clear()
    before = {ln: val.impl_hash(ln) for ln in ("sm80_f16_dwconv", "sm90_f16_wgmma_bmm", "sm90_f16_wgmma")}
    spec = registry.get("gemm")
    real = spec.render
    monkeypatch.setitem(registry._FAMILIES, "gemm",
                        dataclasses.replace(spec, render=lambda lane, c, dt: real(lane, c, dt) + "// changed\n"))
    monkeypatch.setattr(val.paths, "templates_dir", lambda: (_ for _ in ()).throw(AssertionError("fallback")))
    val.impl_hash.cache_clear()
    after = {ln: val.impl_hash(ln) for ln in before}
    assert after["sm80_f16_dwconv"] == before["sm80_f16_dwconv"]
    assert after["sm90_f16_wgmma_bmm"] == before["sm90_f16_wgmma_bmm"]
    assert after["sm90_f16_wgmma"] != before["sm90_f16_wgmma"]
    monkeypatch.undo()
    val.impl_hash.cache_clear()


def test_shipped_db_files_are_stamped_with_this_checkout_s_kernels_or_listed_as_stale():
    """Which shipped files were measured on the kernels this checkout builds (impl equal) is a fact the docs
    state (docs/tuning.md, "Stale shipped entries"); this test keeps that statement true."""
    val.impl_hash.cache_clear()
    stale = set()
    for path in sorted(Path(__file__).resolve().parents[1].joinpath("db", "sm90").glob("*.json")):
        doc = json.loads(path.read_text())
        if doc["validators"]["impl"] != val.impl_hash(doc["lane"]):
            stale.add(path.stem)
    assert stale == set(), stale


def test_publish_with_an_explicit_stamp(env):
    stamp = {"impl": "x", "sku": "NVIDIA H200", "nvcc": "n", "cutlass": "c"}
    p = db.publish("gemm", {SIG: {"regions": [[None, A]]}}, tier="user", arch="sm90", stamp=stamp)
    assert json.loads(p.read_text())["validators"] == stamp

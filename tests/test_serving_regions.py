"""Regions for graphs run without CUDA graphs (``regions_eager``, tune/serving_regions.py): the rule, the DB field,
selection and baking, the build step, the merge, the CLI and the backend's switch."""
from __future__ import annotations

import json

import pytest

from oasr_ops.cli import main as cli_main
from oasr_ops.families.graph import bake
from oasr_ops.inductor.backend import _config_patches
from oasr_ops.inductor.rewrite import OasrRewritePass
from oasr_ops.runtime import select as sel
from oasr_ops.runtime import validators as val
from oasr_ops.tune import database as db
from oasr_ops.tune.serving_regions import HOST_FLOOR_S, build_step, eager_regions, with_eager_regions

LANE = "sm90_f16_wgmma"
A, B, C = "t64x32x64_c1x1_pp", "t64x64x64_c1x1_pp", "t128x128x64_c1x1_pp"
SIG = "gemm|op=gemm|dt=half|N=512|K=512"
US = 1e-6
FLOOR = 8 * US  # the rule's tests use an 8 us floor (their numbers straddle it); the shipped one is HOST_FLOOR_S


def ev(**points):
    """evidence {"M=<m>": {arm: [median_s, sigma, n]}} from keyword args m<M>={arm: us}."""
    return {f"M={k[1:]}": {arm: [t * US, 0.0, 3] for arm, t in row.items()} | {"_l2": "cold"}
            for k, row in points.items()}


def test_launch_bound_points_of_a_torch_region_get_their_fastest_tile():
    regions = [[4096, "torch"], [8192, C], [None, "torch"]]
    evidence = ev(m8={"torch": 3.6, A: 4.2, B: 4.4}, m256={"torch": 3.9, B: 4.3, A: 4.5},
                  m2048={"torch": 5.0, C: 5.4}, m3000={"torch": 7.0, C: 8.5},   # 8.5 us: not launch-bound
                  m6000={"torch": 14.0, C: 12.0}, m12000={"torch": 30.0, C: 25.0})
    out = eager_regions(regions, evidence, floor_s=FLOOR)
    # (0, 8] -> A (measured at 8); (8, 256] -> B; (256, 2048] -> C; (2048, 3000] torch (8.5 us > floor);
    # (3000, 4096]: past the region's last point, rounded up to the next measured point (6000, 12 us): torch;
    # the config region stays; the catch-all: 12000's 25 us tile is not launch-bound -> torch
    assert out == [[8, A], [256, B], [2048, C], [4096, "torch"], [8192, C], [None, "torch"]]
    # the shipped floor (19 us, the H200 host's torch-arm time): 8.5 and 12 us are launch-bound too, 25 us is not
    assert eager_regions(regions, evidence) == [[8, A], [256, B], [8192, C], [None, "torch"]]


def test_a_region_tail_rounds_up_to_the_first_point_of_the_next_region():
    # the Conformer's fc1 at one utterance (M=121): measured points 8..88 in the torch region, 160 in the next one
    regions = [[128, "torch"], [256, B], [None, "torch"]]
    evidence = ev(m8={"torch": 5.8, A: 4.9}, m88={"torch": 6.0, A: 4.8}, m160={"torch": 6.2, B: 5.2, A: 5.8})
    assert eager_regions(regions, evidence, floor_s=FLOOR) == [[88, A], [256, B], [None, "torch"]]
    # without a launch-bound tile at 160 the tail stays torch
    slow = ev(m8={"torch": 5.8, A: 4.9}, m88={"torch": 6.0, A: 4.8}, m160={"torch": 6.2, B: 9.0})
    assert eager_regions(regions, slow, floor_s=FLOOR) == [[88, A], [128, "torch"], [256, B], [None, "torch"]]


def test_catch_all_is_read_up_to_the_largest_measured_m():
    # an entry whose every region is cuBLAS (a captured graph keeps such a site on aten)
    evidence = ev(m8={"torch": 5.9, A: 6.5}, m608={"torch": 6.6, B: 7.3}, m6112={"torch": 20.4, C: 21.7})
    out = eager_regions([[None, "torch"]], evidence)
    assert out == [[8, A], [608, B], [None, "torch"]]


def test_floor_sentinels_and_malformed_evidence():
    evidence = ev(m64={"torch": 4.0, A: 5.0, "heuristic": 1.0, "default": 1.0, "fused": 1.0})
    evidence["M=128"] = "junk"
    evidence["X=5"] = {A: [1e-6, 0, 1]}
    evidence["M=96"] = {A: ["nan"], B: [float("nan"), 0, 1], C: [-1.0, 0, 1]}
    assert eager_regions([[256, "torch"]], evidence) == [[64, A], [256, "torch"]]
    assert eager_regions([[256, "torch"]], evidence, floor_s=4.5 * US) == [[256, "torch"]]
    evidence["M=200"] = {"torch": [4e-6, 0, 1], True: [1e-6, 0, 1], B: [True, 0, 1], "M": [1e-6, 0, 1]}
    evidence["M=٥"] = {A: [1e-6, 0, 1]}  # not an ASCII M: skipped
    assert eager_regions([[256, "torch"]], evidence) == [[64, A], [256, "torch"]]
    assert HOST_FLOOR_S == pytest.approx(19 * US)


def test_with_eager_regions_only_where_it_differs():
    same = {"regions": [[None, "torch"]], "evidence": ev(m64={"torch": 9.0, A: 9.5}), "regions_eager": [[1, A]]}
    assert "regions_eager" not in with_eager_regions(same, floor_s=FLOOR)  # a stale field is dropped
    diff = {"regions": [[None, "torch"]], "evidence": ev(m64={"torch": 4.0, A: 5.0})}
    assert with_eager_regions(diff)["regions_eager"] == [[64, A], [None, "torch"]]
    assert with_eager_regions({"regions": [[None, "torch"]]}) == {"regions": [[None, "torch"]]}


def test_build_step_per_family_and_objective():
    entry = {"regions": [[None, "torch"]], "evidence": ev(m64={"torch": 4.0, A: 5.0})}
    assert "regions_eager" in build_step(entry, SIG, charged=False)
    assert "regions_eager" not in build_step(entry, SIG, charged=True)  # host time already in the objective
    assert "regions_eager" not in build_step(entry, "bmm|op=bmm|dt=half|N=64|K=64", charged=False)


def write_db(root, entries, *, arch="sm90"):
    doc = {"schema": 2, "kernel_family": "gemm", "arch_family": arch, "lane": LANE,
           "validators": val.current_soft_validators(LANE), "configs": {}, "entries": entries}
    p = root / arch / "gemm.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc))
    return p


@pytest.fixture
def env(tuning_env, monkeypatch):
    monkeypatch.setenv("OASR_TUNE_MODEL_FALLBACK", "0")
    db.reload()
    yield tuning_env
    sel.reset_selection()


def test_selection_reads_regions_eager_only_for_eager_graphs(env):
    write_db(env.system, {SIG: {"regions": [[1024, "torch"], [None, C]],
                                "regions_eager": [[256, A], [1024, "torch"], [None, C]]}})
    db.reload()
    assert sel.region_table("gemm", "gemm", "fp16", 512, 512) == [[1024, "torch"], [None, C]]
    assert sel.region_table("gemm", "gemm", "fp16", 512, 512, eager=True) == [[256, A], [1024, "torch"], [None, C]]
    assert sel.select_config("gemm", "gemm", "fp16", 512, 512, 100).config == "torch"  # calls are not eager
    assert sel.eager_answer("gemm", "gemm", "fp16", 512, 512, 100) == (A, "system")
    assert sel.eager_answer("gemm", "gemm", "fp16", 512, 512, 2000) == (C, "system")
    assert sel.eager_answer("gemm", "gemm", "fp16", 768, 512, 100) is None  # no entry: the caller's answer
    # baking: a static M and a symbolic one, both forms
    assert bake("gemm", "gemm", "fp16", 512, 512, 100, None)[:2] == ("torch", "system")
    assert bake("gemm", "gemm", "fp16", 512, 512, 100, None, eager=True)[:2] == (A, "system")
    assert bake("gemm", "gemm", "fp16", 512, 512, None, None)[0] == f"regions:1024=torch;*={C}"
    assert bake("gemm", "gemm", "fp16", 512, 512, None, None, eager=True)[0] == f"regions:256={A};1024=torch;*={C}"


def test_user_tier_without_eager_regions_still_wins(env):
    write_db(env.user, {SIG: {"regions": [[512, B]]}})
    write_db(env.system, {SIG: {"regions": [[1024, "torch"]], "regions_eager": [[1024, A]]}})
    db.reload()
    assert sel.region_table("gemm", "gemm", "fp16", 512, 512, eager=True)[:2] == [[512, B], [1024, A]]


def test_malformed_regions_eager_is_reported_and_the_regions_serve(env):
    write_db(env.system, {SIG: {"regions": [[None, C]], "regions_eager": "nope"},
                          "gemm|op=gemm|dt=half|N=768|K=512": {"regions": [[None, C]],
                                                               "regions_eager": [[64, "t1x1x1_bogus"], [None, C]]}})
    db.reload()
    with pytest.warns(Warning, match="problem"):
        assert sel.region_table("gemm", "gemm", "fp16", 512, 512, eager=True) == [[None, C]]
        # a bad row is a hole: M falls through to the next tier (none here: the lane default), the rest serves
        table = sel.region_table("gemm", "gemm", "fp16", 768, 512, eager=True)
    assert table[-1] == [None, C] and table[0][1] != "t1x1x1_bogus"
    problems = [p for f in db.report()["files"] for p in f["problems"]]
    assert any("regions_eager is not a list; ignored (regions serve)" in p for p in problems), problems
    assert any("regions_eager row 0" in p for p in problems), problems


def test_publish_merge_rederives_regions_eager(env):
    new = {"regions": [[64, "torch"]], "evidence": ev(m64={"torch": 4.0, A: 5.0})}
    db.publish("gemm", {SIG: with_eager_regions(new)}, tier="user", arch="sm90")
    more = {"regions": [[4096, "torch"]], "evidence": ev(m4096={"torch": 6.0, B: 7.0})}
    path = db.publish("gemm", {SIG: with_eager_regions(more)}, tier="user", arch="sm90", merge_regions=True)
    e = json.loads(path.read_text())["entries"][SIG]
    assert e["regions"] == [[64, "torch"], [4096, "torch"]]
    assert e["regions_eager"] == [[64, A], [4096, B]]
    assert {A, B} <= set(json.loads(path.read_text())["configs"])  # eager configs are in the file's table


def test_cli_derives_writes_and_is_idempotent(env, capsys):
    p = write_db(env.user, {SIG: {"regions": [[None, "torch"]], "evidence": ev(m64={"torch": 4.0, A: 5.0})}})
    before = p.read_text()
    assert cli_main(["tune", "serving-regions", "--arch", "sm90", "--tier", "user", "--dry-run"]) == 0
    assert p.read_text() == before and "1 entry would change" in capsys.readouterr().out
    assert cli_main(["tune", "serving-regions", "--arch", "sm90", "--tier", "user"]) == 0
    assert json.loads(p.read_text())["entries"][SIG]["regions_eager"] == [[64, A], [None, "torch"]]
    assert cli_main(["tune", "serving-regions", "--arch", "sm90", "--tier", "user"]) == 0
    assert "0 entries changed" in capsys.readouterr().out
    assert cli_main(["tune", "serving-regions", "--arch", "sm90", "--tier", str(env.user / "none")]) == 2
    assert cli_main(["tune", "serving-regions", "--arch", "sm90", "--family", "nope"]) == 2
    assert "unknown kernel family" in capsys.readouterr().err


def test_a_concurrent_writer_between_read_and_write_is_not_reverted(env, monkeypatch):
    """derive_file reads outside publish's lock: another writer landing its entry in between (a build) must keep
    it — the write is conditional on the file read, the derivation is redone on the new file."""
    from oasr_ops.tune import serving_regions_cli as sr

    p = write_db(env.user, {SIG: {"regions": [[None, "torch"]], "evidence": ev(m64={"torch": 4.0, A: 5.0})}})
    rebuilt = {"regions": [[None, "torch"]], "evidence": ev(m64={"torch": 4.0, B: 5.0}), "source": "aot"}
    real, calls = sr.publish, []

    def racing_publish(*a, **kw):
        calls.append(kw.get("based_on"))
        if len(calls) == 1:  # writer B lands first
            real("gemm", {SIG: rebuilt}, tier="user", arch="sm90")
        return real(*a, **kw)

    monkeypatch.setattr(sr, "publish", racing_publish)
    out = sr.derive_file("gemm", "sm90", tier="user", floor_s=FLOOR)
    e = json.loads(p.read_text())["entries"][SIG]
    assert e["source"] == "aot" and e["evidence"] == rebuilt["evidence"]  # B's entry kept...
    assert e["regions_eager"] == [[64, B], [None, "torch"]] == out[SIG]  # ...and derived from, not from the old
    assert len(calls) == 2 and calls[0] != calls[1]  # the first write refused (the file had changed), redone

    def always_racing(*a, **kw):
        real("gemm", {SIG: {**rebuilt, "notes": [str(len(calls))]}}, tier="user", arch="sm90")
        calls.append(1)
        return real(*a, **kw)

    write_db(env.user, {SIG: {"regions": [[None, "torch"]], "evidence": ev(m64={"torch": 4.0, A: 5.0})}})
    monkeypatch.setattr(sr, "publish", always_racing)
    with pytest.raises(TimeoutError, match="changed since it was read.*3 times"):
        sr.derive_file("gemm", "sm90", tier="user", floor_s=FLOOR, attempts=3)


def test_cli_names_a_tier_it_cannot_write_before_reading_it(env, capsys, monkeypatch):
    """A read-only tier (a packaged system tier): one usage line naming the directory, exit 2, no traceback;
    --dry-run writes nothing and still runs. (Tests may run as root, whom no chmod stops: the access check is
    what is faked.)"""
    import os

    from oasr_ops.tune import build_cli

    write_db(env.user, {SIG: {"regions": [[None, "torch"]], "evidence": ev(m64={"torch": 4.0, A: 5.0})}})
    real = os.access
    monkeypatch.setattr(build_cli.os, "access", lambda p, m: False if m & os.W_OK else real(p, m))
    assert cli_main(["tune", "serving-regions", "--arch", "sm90", "--tier", "user"]) == 2
    err = capsys.readouterr().err
    assert "not writable by this user" in err and str(env.user) in err and "Traceback" not in err
    assert cli_main(["tune", "serving-regions", "--arch", "sm90", "--tier", "user", "--dry-run"]) == 0


def test_cli_seeds_a_user_tier_from_the_system_one_at_another_floor(env, capsys):
    other = "gemm|op=gemm|dt=half|N=768|K=512"
    sys_entries = {SIG: {"regions": [[None, "torch"]], "evidence": ev(m64={"torch": 4.0, A: 5.0}, m608={"torch": 6.0,
                                                                                                        B: 9.0})},
                   other: {"regions": [[None, C]], "evidence": ev(m64={"torch": 4.0, C: 3.0})}}
    sp = write_db(env.system, sys_entries)
    system_before = sp.read_text()
    up = env.user / "sm90" / "gemm.json"
    assert not up.exists()
    argv = ["tune", "serving-regions", "--arch", "sm90", "--tier", "user", "--seed-from", "system", "--floor-us"]
    assert cli_main(argv + ["6"]) == 0
    user = json.loads(up.read_text())["entries"]
    assert sp.read_text() == system_before  # the seed is only read
    assert user[SIG]["regions_eager"] == [[64, A], [None, "torch"]]  # 9 us at M=608 is past a 6 us floor
    assert user[SIG]["evidence"] == sys_entries[SIG]["evidence"] and "regions_eager" not in user[other]
    assert "2 entries changed" in capsys.readouterr().out
    db.reload()
    assert sel.region_table("gemm", "gemm", "fp16", 512, 512, eager=True) == [[64, A], [None, "torch"]]
    # again at another floor: the user entries are re-derived from their own evidence, nothing new is copied
    assert cli_main(argv + ["10"]) == 0
    assert json.loads(up.read_text())["entries"][SIG]["regions_eager"] == [[64, A], [608, B], [None, "torch"]]
    assert "1 entry changed" in capsys.readouterr().out
    # a user entry of its own is kept (the seed fills in only what the file lacks)
    write_db(env.user, {other: {"regions": [[None, B]]}})
    assert cli_main(argv + ["6"]) == 0
    user = json.loads(up.read_text())["entries"]
    assert user[other]["regions"] == [[None, B]] and user[SIG]["regions_eager"] == [[64, A], [None, "torch"]]
    # bad floors and a missing seed are usage errors
    assert cli_main(argv + ["0"]) == 2 and cli_main(argv + ["nan"]) == 2
    assert "--floor-us must be a positive" in capsys.readouterr().err
    assert cli_main(["tune", "serving-regions", "--arch", "sm90", "--tier", "user", "--seed-from",
                     str(env.user / "none")]) == 2


def test_shipped_gemm_db_serves_tiles_to_eager_graphs_at_small_m():
    """The shipped file carries the field, derived from its own evidence (`oasr tune serving-regions`)."""
    from oasr_ops import paths

    doc = json.loads((paths.system_db_dir() / "sm90" / "gemm.json").read_text())
    for sig, e in doc["entries"].items():
        assert e.get("regions_eager") == with_eager_regions(e).get("regions_eager"), sig
    fc1 = doc["entries"]["gemm|op=gemm_activation|dt=half|N=2048|K=512"]
    assert dict((hi, c) for hi, c in fc1["regions"])[128] == "torch"
    assert sel.resolve_in_table(fc1["regions_eager"], 121) != "torch"  # one utterance of the example Conformer


def test_backend_bakes_eager_regions_only_without_cuda_graphs(monkeypatch):
    from oasr_ops.inductor import backend

    def ours(p):
        return p["post_grad_custom_pre_pass"]

    assert ours(_config_patches(None, {}, [])).eager is False  # no CUDA inputs
    monkeypatch.setattr(backend, "_any_cuda", lambda xs: True)
    assert ours(_config_patches(None, {}, [])).eager is True
    assert ours(_config_patches("reduce-overhead", {}, [])).eager is False
    assert ours(_config_patches(None, {"triton.cudagraphs": True}, [])).eager is False
    assert ours(_config_patches(None, {}, [], eager_regions=False)).eager is False
    # the FX graph cache must not hand one mode's graph to the other
    assert OasrRewritePass(eager=True).uuid() != OasrRewritePass(eager=False).uuid()
    with pytest.raises(ValueError, match="eager_regions"):
        backend.oasr_backend(None, [], options={"eager_regions": "yes"})
    with pytest.raises(ValueError, match=r"options\['cpp_hot_path'\] must be True or False, got 'no'"):
        backend.oasr_backend(None, [], options={"cpp_hot_path": "no"})


def test_the_graph_pass_bakes_eager_tables_only_when_told(env):
    """The rewrite of a traced Linear with a symbolic M: the graph table, or with ``eager`` the eager one."""
    import torch
    from torch import nn

    from oasr_ops.tune.census import trace_sites

    write_db(env.system, {SIG: {"regions": [[1024, "torch"], [None, C]],
                                "regions_eager": [[256, A], [1024, "torch"], [None, C]]}})
    db.reload()
    lin = nn.Linear(512, 512).half()
    params = dict(lin.named_parameters())
    fn = lambda *a: torch.func.functional_call(lin, dict(zip(params, a[:-1])), a[-1:])  # noqa: E731
    x = torch.randn(4, 64, 512, dtype=torch.float16)
    baked = {}
    for eager in (False, True):
        res, _, _ = trace_sites(fn, [*params.values(), x], {2: [0, 1]}, bake=True, arch="sm90", eager=eager)
        assert len(res.sites) == 1, res.skipped
        baked[eager] = res.sites[0].config
    assert baked == {False: f"regions:1024=torch;*={C}", True: f"regions:256={A};1024=torch;*={C}"}

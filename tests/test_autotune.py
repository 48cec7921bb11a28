"""oasr_ops.autotune() on a CPU: buckets, lookups, misses, the cache file (v1/v2/v3, other arch, concurrent
flushes), publishing into a user tier, refusal inside a capture, no-op without a GPU. Profiling goes through an
injected fake measurer (the real one, tune.bench, needs a GPU); selection goes through runtime.select as the ops'
``config="auto"`` does."""
from __future__ import annotations

import json
import multiprocessing as mp
import warnings

import pytest
import torch

import oasr_ops
from oasr_ops.runtime import registry
from oasr_ops.runtime.select import select_config
from oasr_ops.tune import autotune as at
from oasr_ops.tune import database
from oasr_ops.tune.autotune_cache import AutotuneWarning, Result, ResultCache, parse_results
from oasr_ops.tune.shapes import bucket_of

SIG = "gemm|op=gemm|dt=fp16|N=512|K=256"
N, K = 512, 256


class FakeMeasurer:
    """Times each candidate deterministically; the winner depends on M so tests can tell results apart."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def winner(self, cands, m):
        return cands[m % len(cands)].id

    def __call__(self, point, cands):
        self.calls.append((point.signature, point.m, len(cands)))
        best = self.winner(cands, point.m)
        return {c.id: (1e-6 if c.id == best else 2e-6 + i * 1e-7) for i, c in enumerate(cands)}


@pytest.fixture(autouse=True)
def _fresh_warnings():
    at._WARNED.clear()
    yield
    at._WARNED.clear()


def _sel(m, op="gemm", dtype="fp16", n=N, k=K, family="gemm"):
    return select_config(family, op, dtype, n, k, m)


def _cands(m):
    from oasr_ops.tune.candidates import candidates_for, parts_of

    return candidates_for(parts_of(SIG), "sm90")


# ------------------------------------------------------------------------------------------- buckets, lookup

@pytest.mark.parametrize("m,b", [(1, 8), (8, 8), (9, 16), (127, 128), (128, 128), (129, 184), (184, 184),
                                 (185, 256), (1023, 1024), (1024, 1024), (1025, 2048), (4097, 8192)])
def test_bucket_edges(m, b):
    assert bucket_of(m) == b


def test_lookup_closest_measured_at_or_above_within_the_bucket():
    c = ResultCache("sm90")
    c.add(SIG, Result(100, "A"))                  # bucket 104
    c.add(SIG, Result(103, "B"))
    assert c.lookup(SIG, 97).config == "A" and c.lookup(SIG, 100).config == "A"
    assert c.lookup(SIG, 101).config == "B" and c.lookup(SIG, 103).config == "B"
    assert c.lookup(SIG, 104) is None             # a larger size in the same bucket: a miss
    assert c.lookup(SIG, 96) is None              # another bucket (89..96) never answers
    assert c.lookup(SIG, 105) is None
    assert c.lookup("gemm|op=gemm|dt=bf16|N=512|K=256", 100) is None   # the dtype is part of the key


def test_context_profiles_once_per_result_and_misses_above_the_measured_m(tuning_env):
    fake = FakeMeasurer()
    with oasr_ops.autotune(measure=fake, publish=False) as tuner:
        s = _sel(100)
        assert s.tier == "autotune" and s.config == fake.winner(_cands(100), 100)
        assert len(fake.calls) == 1 and fake.calls[0][:2] == (SIG, 100)
        assert fake.calls[0][2] == len(_cands(100))   # every feasible candidate, torch included
        assert _sel(100) == s and _sel(97).config == s.config      # at or below the measured M: no profile
        assert len(fake.calls) == 1
        s102 = _sel(102)                                            # same bucket, larger: measured at 102
        assert len(fake.calls) == 2 and s102.config == fake.winner(_cands(102), 102)
        assert _sel(101).config == s102.config                      # the closest measured M at or above
        _sel(100, dtype="bf16")                                     # another dtype: its own profile
        assert len(fake.calls) == 3
    assert tuner.stats.profiles == 3
    assert _sel(100).tier != "autotune"                              # outside: the DB chain again


def test_autotune_false_serves_results_and_falls_back_on_a_miss(tuning_env, tmp_path):
    cache = tmp_path / "c.json"
    fake = FakeMeasurer()
    with oasr_ops.autotune(cache=cache, measure=fake, publish=False):
        won = _sel(100).config
    assert json.loads(cache.read_text())["version"] == 3
    fake2 = FakeMeasurer()
    with oasr_ops.autotune(False, cache=cache, measure=fake2, publish=False) as t:
        assert _sel(99) .tier == "autotune" and _sel(99).config == won
        miss = _sel(103)
        # a miss is not measured: the chain below autotune answers, for gemm (a `modelled` family) the cost-model
        # tier, exactly as it does outside the context
        assert miss.tier == "model" and fake2.calls == []
    assert t.stats.misses == 1
    assert _sel(103) == miss


def test_second_process_style_reuse_profiles_nothing(tuning_env, tmp_path):
    cache = tmp_path / "c.json"
    with oasr_ops.autotune(cache=cache, measure=FakeMeasurer(), publish=False):
        for m in (8, 50, 100, 300, 1500):
            _sel(m)
    fake = FakeMeasurer()
    with oasr_ops.autotune(cache=cache, measure=fake, publish=False) as t:
        for m in (8, 50, 100, 300, 1500):
            assert _sel(m).tier == "autotune"
    assert fake.calls == [] and t.stats.hits == 5


def test_failing_measurer_warns_and_falls_back(tuning_env):
    def broken(point, cands):
        raise RuntimeError("boom")

    with pytest.warns(AutotuneWarning, match="profiling .* failed"):
        with oasr_ops.autotune(measure=broken, publish=False):
            fell_back = _sel(64)
            assert fell_back.tier == "model"  # the next tier answers (gemm is `modelled`: the cost-model tier)
    assert _sel(64) == fell_back  # the same answer as without autotune


def test_families_opt_in_through_the_registry():
    fams = at.autotune_families()
    assert {"gemm", "bmm", "scaled_mm"} <= set(fams)
    for name in fams:
        spec = registry.get(name)
        assert spec.handlers.get("autotune") is not False


def test_scaled_mm_and_bmm_are_tuned_too(tuning_env):
    fake = FakeMeasurer()
    with oasr_ops.autotune(measure=fake, publish=False):
        s = select_config("scaled_mm", "scaled_mm", "int8", 768, 256, 40)
        b = select_config("bmm", "bmm", "fp16", 64, 64, 40)
    assert s.tier == "autotune" and b.tier == "autotune"
    assert [c[0] for c in fake.calls] == ["scaled_mm|op=scaled_mm|N=768|K=256", "bmm|op=bmm|dt=fp16|N=64|K=64"]


# ------------------------------------------------------------------------------------------- the cache file

def _write(path, doc):
    path.write_text(json.dumps(doc))
    return path


def test_v3_v2_v1_loading(tmp_path):
    v3 = _write(tmp_path / "v3.json", {"version": 3, "arch": "sm90", "results": {SIG: {
        "104": [{"m": 100, "config": "torch"}, {"m": 103, "config": "default"}]}}})
    v2 = _write(tmp_path / "v2.json", {"version": 2, "arch": "sm90", "results": {SIG: {"104": {"config": "torch"}}}})
    v1 = _write(tmp_path / "v1.json", {"version": 1, "arch": "sm90", "results": {SIG: {"100": "torch",
                                                                                       "300": {"config": "default"}}}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AutotuneWarning)  # env differences (no env stamp in these files)
        c3, c2, c1 = ResultCache("sm90"), ResultCache("sm90"), ResultCache("sm90")
        assert c3.load(v3) == 2 and c2.load(v2) == 1 and c1.load(v1) == 2
    assert c3.lookup(SIG, 101).config == "default" and c3.lookup(SIG, 104) is None
    assert c2.lookup(SIG, 97).config == "torch" and c2.lookup(SIG, 104).config == "torch"   # the whole bucket
    assert c2.lookup(SIG, 96) is None
    assert c1.lookup(SIG, 100).config == "torch" and c1.lookup(SIG, 101) is None           # exact shapes
    assert c1.lookup(SIG, 257).config == "default" and c1.lookup(SIG, 301) is None         # 300: bucket 360


@pytest.mark.filterwarnings("ignore:.*another environment")
def test_malformed_results_are_skipped_with_one_warning(tmp_path):
    p = _write(tmp_path / "bad.json", {"version": 3, "arch": "sm90", "results": {
        SIG: {"104": [{"m": 100, "config": "torch"}, {"m": 200, "config": "torch"}, {"m": 90, "config": "!!"}],
              "100": [{"m": 100, "config": "torch"}]},
        "not|a|sig": {"8": [{"m": 8, "config": "torch"}]}}})
    c = ResultCache("sm90")
    with pytest.warns(AutotuneWarning, match="4 malformed"):
        assert c.load(p) == 1


def test_other_arch_is_not_loaded_and_not_overwritten(tmp_path):
    p = _write(tmp_path / "c.json", {"version": 3, "arch": "sm80", "results": {SIG: {"104": [{"m": 100,
                                                                                               "config": "torch"}]}}})
    c = ResultCache("sm90")
    with pytest.warns(AutotuneWarning, match="tuned on 'sm80'"):
        assert c.load(p) == 0
    assert c.lookup(SIG, 100) is None
    c.add(SIG, Result(100, "default"))
    with pytest.warns(AutotuneWarning, match="another arch"):
        assert c.flush(p) == 0
    assert json.loads(p.read_text())["arch"] == "sm80"


def test_newer_version_is_not_overwritten(tmp_path):
    doc = {"version": 4, "arch": "sm90", "results": {}}
    p = _write(tmp_path / "c.json", doc)
    c = ResultCache("sm90")
    c.add(SIG, Result(100, "default"))
    with pytest.warns(AutotuneWarning, match="newer oasr_ops.*unknown version 4.*not overwritten"):
        assert c.flush(p) == 0
    assert json.loads(p.read_text()) == doc


@pytest.mark.parametrize("raw", [b"\xff\xfe not utf-8", b"[" * 100_000, b"{\"version\": 3,", b"[1, 2]"],
                         ids=["not-utf8", "too-deep", "torn", "not-an-object"])
def test_unreadable_cache_warns_on_load_and_is_kept_aside_on_flush(tmp_path, raw):
    """Any unreadable cache: load warns and loads nothing; flush keeps the old bytes aside (one warning naming
    where) and writes a fresh file — never a traceback, never a silent overwrite."""
    p = tmp_path / "c.json"
    p.write_bytes(raw)
    c = ResultCache("sm90")
    with pytest.warns(AutotuneWarning, match="not loaded"):
        assert c.load(p) == 0
    c.add(SIG, Result(100, "torch"))
    with pytest.warns(AutotuneWarning, match="moved aside to"):
        assert c.flush(p) == 1
    kept = list(tmp_path.glob("c.json.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == raw
    assert json.loads(p.read_text())["results"][SIG]


def test_flush_keeps_the_file_mode(tmp_path):
    p = tmp_path / "c.json"
    c = ResultCache("sm90")
    c.add(SIG, Result(100, "torch"))
    c.flush(p)
    p.chmod(0o600)
    c.add(SIG, Result(200, "torch"))
    c.flush(p)
    assert p.stat().st_mode & 0o777 == 0o600


def test_environment_difference_warns_but_loads(tmp_path):
    from oasr_ops.tune.autotune_cache import current_env

    env = {**current_env(), "torch": "0.0.1"}
    p = _write(tmp_path / "c.json", {"version": 3, "arch": "sm90", "env": env,
                                     "results": {SIG: {"104": [{"m": 100, "config": "torch"}]}}})
    c = ResultCache("sm90")
    with pytest.warns(AutotuneWarning, match="another environment.*torch"):
        assert c.load(p) == 1


def test_same_environment_loads_silently(tmp_path):
    c = ResultCache("sm90")
    c.add(SIG, Result(100, "torch", 3.5, 7))
    p = tmp_path / "c.json"
    assert c.flush(p) == 1 and c.pending() == 0
    d = ResultCache("sm90")
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutotuneWarning)
        assert d.load(p) == 1
    assert d.lookup(SIG, 100) == Result(100, "torch", 3.5, 7)


def _flusher(path: str, worker: int, n: int) -> None:
    c = ResultCache("sm90")
    for i in range(n):  # one flush per result: many interleaved read-merge-write cycles
        m = 8 * (worker * n + i + 1)
        c.add(f"gemm|op=gemm|dt=fp16|N={512 + 8 * worker}|K=256", Result(m, "torch"))
        c.flush(path)


def test_concurrent_flushes_lose_nothing(tmp_path):
    path = str(tmp_path / "shared.json")
    workers, n = 4, 12
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_flusher, args=(path, w, n)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    results, bad = parse_results(json.loads(open(path).read()))
    assert bad == 0
    assert sum(len(v) for v in results.values()) == workers * n
    assert not list(tmp_path.glob(".shared.json.*.tmp"))


# ------------------------------------------------------------------------------------------- publish

def test_publish_into_the_user_tier_at_the_measured_m(tuning_env, tmp_path):
    fake = FakeMeasurer()
    with pytest.warns(AutotuneWarning, match=r"reload_tuning\(\)"):
        with oasr_ops.autotune(cache=tmp_path / "c.json", measure=fake) as t:
            won = _sel(100).config
    assert t.stats.published
    doc = json.loads((tuning_env.user / "sm90" / "gemm.json").read_text())
    e = doc["entries"][SIG]
    assert e["regions"] == [[100, won]] and e["source"] == "autotune"
    assert _sel(100).tier != "user"            # the process keeps its snapshot until a reload
    database.reload()
    assert _sel(100) .tier == "user" and _sel(100).config == won and _sel(99).config == won
    assert _sel(101).tier != "user"            # no catch-all: above the measured M falls through


def test_an_unwritable_cache_and_user_tier_warn_at_exit_and_keep_serving(tuning_env, tmp_path, monkeypatch):
    """The cache path and the user tier both under a regular file (NotADirectoryError, what a read-only or
    mistyped path gives): leaving the context warns once for each and raises nothing; the winners were served."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("OASR_TUNE_USER_DB", str(blocker / "user"))
    fake = FakeMeasurer()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        with oasr_ops.autotune(cache=blocker / "c.json", measure=fake) as t:
            assert _sel(100).tier == "autotune"
    texts = [str(w.message) for w in got]
    assert any("results not saved to" in m and "c.json" in m for m in texts), texts
    assert any("gemm winners not published" in m for m in texts), texts
    assert not t.stats.published and not t.active


def test_publish_false_writes_no_db(tuning_env):
    with oasr_ops.autotune(measure=FakeMeasurer(), publish=False):
        _sel(100)
    assert not (tuning_env.user / "sm90" / "gemm.json").exists()


# ------------------------------------------------------------------------------------------- refusals, no-ops

def test_refuses_to_profile_inside_a_capture_but_serves_tuned_shapes(tuning_env, monkeypatch):
    fake = FakeMeasurer()
    with oasr_ops.autotune(measure=fake, publish=False):
        won = _sel(100).config
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        assert _sel(98).config == won                              # tuned: served inside the capture
        with pytest.raises(at.AutotuneError, match="inside a CUDA-graph capture"):
            _sel(300)
    assert len(fake.calls) == 1


def test_noop_with_one_warning_on_a_cpu(tuning_env):
    assert not torch.cuda.is_available()
    before = _sel(100)
    with pytest.warns(AutotuneWarning, match="no GPU"):
        with oasr_ops.autotune() as t:
            assert _sel(100) == before and not t.active
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutotuneWarning)
        with oasr_ops.autotune():                  # said once
            pass


def test_inside_torch_compile_changes_nothing(tuning_env, monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    fake = FakeMeasurer()
    with pytest.warns(AutotuneWarning, match="torch.compile"):
        with oasr_ops.autotune(measure=fake, publish=False) as t:
            assert _sel(100).tier != "autotune"
    assert not t.active and fake.calls == []


def test_bad_space_is_a_clear_error():
    with pytest.raises(ValueError, match="space must be one of"):
        oasr_ops.autotune(space="everything")


def test_plan_cache_is_reentrant():
    """autotune() times other configs (their plans are made) while the calling op's own plan is being made."""
    from oasr_ops.runtime.plans import Plan, PlanCache

    pc = PlanCache()

    def outer():
        inner = pc.get_or_make(("inner",), lambda: Plan("torch", "explicit", "s", lambda: None))
        return Plan("chosen:" + inner.config, "autotune", "s", lambda: None)

    assert pc.get_or_make(("outer",), outer).config == "chosen:torch"
    assert set(pc.plans) == {("outer",), ("inner",)}


# ------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_real_measurer_tunes_an_eager_gemm(tmp_path, monkeypatch):
    monkeypatch.setenv("OASR_TUNE_USER_DB", str(tmp_path / "user"))
    database.reload()
    a = torch.randn(200, 256, device="cuda", dtype=torch.float16)
    w = torch.randn(512, 256, device="cuda", dtype=torch.float16) / 16
    b = torch.randn(512, device="cuda", dtype=torch.float16)
    ref = torch.nn.functional.linear(a.double(), w.double(), b.double())
    with oasr_ops.autotune(cache=tmp_path / "c.json", space="compiled") as t:
        y = oasr_ops.gemm(a, w, b)
        sel = select_config("gemm", "gemm", "fp16", 512, 256, 200)
        y2 = oasr_ops.gemm(a[:190], w, b)  # same bucket, below the measured M: no new profile
    assert sel.tier == "autotune" and t.stats.profiles == 1
    assert (y.double() - ref).abs().max().item() < 0.05 and y2.shape == (190, 512)
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["results"][SIG]["256"][0]["m"] == 200
    database.reload()

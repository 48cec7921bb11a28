"""Prewarm within its budget (issue 11, item 5): compile first (counted), heaviest points first, overrun by at
most one point, the rest left to the model tier. A fake clock and fake compile/measure; no GPU."""
from types import SimpleNamespace

from oasr_ops.runtime import registry
from oasr_ops.tune import prewarm
from oasr_ops.tune.points import Point, point_of


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _points():
    # weights deliberately out of M order
    return [Point(m, weight=w, signature="gemm|op=gemm|dt=half|N=64|K=64", dtype="fp16")
            for m, w in ((16, 1.0), (32, 5.0), (64, 3.0), (128, 4.0), (256, 2.0))]


def _run(budget, compile_s, point_s, points=None):
    clock = Clock()
    order = []

    def compile_fn(pts):
        assert [p.weight for p in pts] == sorted((p.weight for p in pts), reverse=True)
        clock.t += compile_s
        return SimpleNamespace(built=["k1", "k2"], failed={})

    def measure_fn(p, deadline):
        assert deadline == 1000.0 + budget
        order.append(p.m)
        clock.t += point_s
        return ("torch", 1e-6) if p.m != 64 else None  # nothing passed its gate at 64

    run = prewarm.run_within_budget(points or _points(), budget, compile_fn=compile_fn, measure_fn=measure_fn,
                                    clock=clock)
    return run, order, clock.t - 1000.0


def test_compile_counts_against_the_budget_and_points_go_heaviest_first():
    run, order, spent = _run(budget=60.0, compile_s=25.0, point_s=10.0)
    assert order == [32, 128, 64, 256]  # 25 + 10 + 10 + 10 = 55 < 60: a fourth point starts, then time is up
    assert run.compile_s == 25.0 and run.measure_s == 40.0 and run.compiled == ["k1", "k2"]
    assert spent <= 60.0 + 10.0  # overrun by at most one point's measurement
    assert sorted(k[2] for k in run.measured) == [32, 128, 256]
    assert [p.m for p in run.left] == [64, 16]  # 64 measured without a winner, 16 never reached


def test_a_compile_longer_than_the_budget_measures_nothing():
    run, order, spent = _run(budget=60.0, compile_s=75.0, point_s=10.0)
    assert order == [] and not run.measured and len(run.left) == 5 and spent == 75.0


def test_everything_fits():
    run, order, _ = _run(budget=600.0, compile_s=5.0, point_s=1.0)
    assert len(order) == 5 and len(run.measured) == 4 and [p.m for p in run.left] == [64]


def test_candidate_specs_are_the_prewarm_candidates_kernels():
    sig = "gemm|op=gemm_activation|dt=half|N=64|K=64"
    pts = [point_of(sig, 24, "fp16"), point_of(sig, 48, "bf16"), point_of(sig, 96, "fp16")]
    specs = prewarm.candidate_specs(pts, "sm90")
    lane = registry.native_lane("sm90", "gemm")
    cheap = {lane.default.kernel_key(), *(c.kernel_key() for c in lane.coverage_basis)}
    got = {(s.config.kernel_key(), s.dtype) for s in specs}
    assert got == {(c, dt) for c in cheap for dt in ("fp16", "bf16")}  # no torch, no duplicates
    assert len(specs) == len({s.name for s in specs})


def test_report_says_compiled_measured_and_left(monkeypatch, tmp_path):
    import torch

    from oasr_ops.runtime import arch
    from oasr_ops.tuning import TuningConfig

    run, _order, _ = _run(budget=60.0, compile_s=25.0, point_s=10.0)
    monkeypatch.setattr(prewarm, "is_covered", lambda p, arch=None: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(arch, "current_arch_family", lambda *a, **k: "sm90")
    monkeypatch.setattr(prewarm, "measure_within_budget", lambda pts, budget: run)
    monkeypatch.setattr(prewarm, "publish_winners", lambda measured: [])
    monkeypatch.setenv("OASR_TUNE_USER_DB", str(tmp_path / "user"))  # conftest turns it off
    rep = prewarm.run_prewarm(_points(), TuningConfig(mode="prewarm", budget_s=60.0))
    assert rep.compiled == ["k1", "k2"] and rep.compile_s == 25.0 and rep.measure_s == 40.0
    assert len(rep.measured) == 3 and sorted(p.m for p in rep.left_to_model) == [16, 64]
    text = str(rep)
    assert "compiled 2 kernel(s) in 25.0s" in text and "measured 3 point(s) in 40.0s" in text
    assert "2 left to the model" in text and "1 point(s) not reached" in text


def _fake_gpu(monkeypatch):
    import torch

    from oasr_ops.runtime import arch

    monkeypatch.setattr(prewarm, "is_covered", lambda p, arch=None: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(arch, "current_arch_family", lambda *a, **k: "sm90")


def test_user_tier_off_measures_nothing_and_says_so(monkeypatch):
    """OASR_TUNE_USER_DB=off: the winners could not be published (they are served through that tier), so nothing
    is measured — one warning, the report's note — instead of measuring and then failing the compile."""
    import pytest

    from oasr_ops.tuning import TuningConfig

    _fake_gpu(monkeypatch)
    monkeypatch.setenv("OASR_TUNE_USER_DB", "off")
    monkeypatch.setattr(prewarm, "measure_within_budget", lambda pts, budget: pytest.fail("measured"))
    with pytest.warns(UserWarning, match="user tier is disabled.*5 uncovered point"):
        rep = prewarm.run_prewarm(_points(), TuningConfig(mode="prewarm", budget_s=60.0), inside_compile=True)
    assert not rep.measured and not rep.published and "OASR_TUNE_USER_DB=off" in rep.note
    assert len(rep.left_to_model) == 5


def test_a_publish_failure_keeps_the_report_and_warns(monkeypatch):
    """An unwritable or unusable user tier at publish time: the compile goes on (cost-model tier for those
    points), one warning names the cause, the report keeps what was measured."""
    import pytest

    from oasr_ops.tuning import TuningConfig

    run, _order, _ = _run(budget=60.0, compile_s=25.0, point_s=10.0)
    _fake_gpu(monkeypatch)
    monkeypatch.setenv("OASR_TUNE_USER_DB", "/ro/user")
    monkeypatch.setattr(prewarm, "measure_within_budget", lambda pts, budget: run)

    def publish(measured):
        raise PermissionError(13, "Permission denied", "/ro/user/sm90/gemm.json.lock")

    monkeypatch.setattr(prewarm, "publish_winners", publish)
    with pytest.warns(UserWarning, match="3 measured point.*not published.*Permission denied"):
        rep = prewarm.run_prewarm(_points(), TuningConfig(mode="prewarm", budget_s=60.0), inside_compile=True)
    assert len(rep.measured) == 3 and not rep.published
    assert "not published" in rep.note and "1 point(s) not reached" in rep.note

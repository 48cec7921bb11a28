"""`oasr tune matrix` on the CPU: the plan (`--dry-run`), checkpoint/resume with a test double of the GPU
measurement (tests/matrix_fake.py), and a real local Dask cluster whose GPU worker is killed mid-signature.
Only the timing is fake; the Dask cluster, the files, checkpoints, partition and publish are the real ones."""
import json
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from oasr_ops import cli
from oasr_ops.errors import UsageError
from oasr_ops.tune import database
from oasr_ops.tune.build import load_works, read_checkpoint, run_build
from oasr_ops.tune.from_log import model_from_log
from oasr_ops.tune.matrix import tasks
from oasr_ops.tune.matrix.plan import MatrixOptions, make_plan, record_run
from oasr_ops.tune.prebuild import census_plan

sys.path.insert(0, str(Path(__file__).parent))
import matrix_fake  # noqa: E402

FAKE = "matrix_fake:measure"
SIGS = [f"gemm|op=gemm|dt=half|N={n}|K=256" for n in (256, 512, 768, 1024, 1536, 2048)]


def _census(path: Path, sigs=SIGS, ms=(1, 7, 17, 64, 127, 300, 1000)) -> str:
    path.write_text(json.dumps({"kind": "oasr-census", "weight_bytes": 1 << 20, "signatures": {
        s: {"points": [{"m": m, "weight": 1.0 + (m % 5), "calls": 3} for m in ms]} for s in sigs}}))
    return str(path)


def _events(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def fake_env(tmp_path, monkeypatch):
    """The environment the test double and the workers read (inherited by Dask's worker processes)."""
    monkeypatch.setenv("OASR_FAKE_EVENTS", str(tmp_path / "events.jsonl"))
    monkeypatch.setenv("OASR_JIT_DIR", str(tmp_path / "jit"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parents[1]),
                                                      os.environ.get("PYTHONPATH", "")]))
    (tmp_path / "jit").mkdir(mode=0o700)
    return tmp_path


def _options(tmp_path, census, **kw) -> MatrixOptions:
    return MatrixOptions(census=[census], archs=["sm90"], families=["gemm"], out=tmp_path / "out", run_id="r1",
                         max_points=4, max_fill=1, measurer=FAKE, **kw)


# ------------------------------------------------------------------------------------------------------ plan

def test_dry_run_plans_every_arch_and_spends_nothing(tmp_path, capsys):
    c = _census(tmp_path / "c.json", SIGS[:2])
    out = tmp_path / "out"
    rc = cli.main(["tune", "matrix", "--census", c, "--arch", "sm90,sm80", "--arch", "8.9", "--dry-run",
                   "--out", str(out), "--max-points", "4", "--max-fill", "1"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["archs"]) == ["sm90", "sm80", "sm89"]
    sm90 = doc["archs"]["sm90"]
    assert sm90["families"]["gemm"]["lane"] == "sm90_f16_wgmma"
    assert sm90["families"]["gemm"]["signatures"] == 2 and sm90["measure_tasks"] == 6  # gemm + its int8, fp8 twins
    assert set(sm90["compile_tasks"]) == {"sm90_f16_wgmma", "sm90_int8_wgmma", "sm90_fp8_wgmma"}
    assert doc["archs"]["sm80"]["families"]["gemm"]["lane"] == "sm80_f16_mma"
    assert not out.exists()  # the plan creates nothing
    # the compile set is exactly what `oasr tune prebuild --census` plans for the same build options
    mo = MatrixOptions(census=[c], archs=["sm90"], out=out, run_id="x", max_points=4, max_fill=1)
    plan = make_plan(mo)
    want = census_plan([c], "sm90", opts=mo.build_options("gemm", "sm90"))
    got = sorted(m.config for ct in plan.archs[0].compile if ct.lane == "sm90_f16_wgmma" for m in ct.modules)
    assert got == want[("gemm", "fp16")]


def test_usage_errors_name_the_problem(tmp_path):
    c = _census(tmp_path / "c.json", SIGS[:1])
    args = cli.build_parser().parse_args(["tune", "matrix", "--census", c, "--arch", "sm90"])
    with pytest.raises(UsageError, match="--scheduler ADDR or --local-gpus"):
        args.func(args)
    args = cli.build_parser().parse_args(["tune", "matrix", "--census", c, "--arch", "sm90", "--dry-run",
                                          "--run-id", "../x", "--out", str(tmp_path)])
    with pytest.raises(UsageError, match="names a directory"):
        args.func(args)
    args = cli.build_parser().parse_args(["tune", "matrix", "--census", c, "--arch", "sm9x", "--dry-run"])
    with pytest.raises(UsageError, match="--arch"):
        args.func(args)
    mo = _options(tmp_path, c)
    assert record_run(mo) is False and record_run(mo) is True
    with pytest.raises(UsageError, match="max_points"):
        record_run(replace(mo, max_points=8))


# ------------------------------------------------------------------------------------------ checkpoint/resume

def _run_tasks(plan) -> list[dict]:
    mo = plan.options
    out = []
    for ap in plan.archs:
        for t in ap.todo():
            out.append(tasks.measure_task(t, mo.build_options(t.family, ap.arch),
                                          str(mo.pair_dir(ap.arch, t.family) / "logs"), mo.measurer))
        for fam, lane in ap.lanes.items():
            out.append(tasks.publish_pair(ap.arch, fam, lane, [t.signature for t in ap.measure if t.family == fam],
                                          mo.build_options(fam, ap.arch), str(mo.pair_dir(ap.arch, fam) / "logs"),
                                          str(mo.out)))
    return out


def test_checkpoints_resume_and_a_fault_loses_only_its_signature(fake_env, monkeypatch):
    c = _census(fake_env / "c.json")
    mo = _options(fake_env, c)
    plan = make_plan(mo)
    order = [t.signature for t in plan.archs[0].measure]  # the census' signatures, sorted
    assert sorted(order) == sorted(SIGS)
    monkeypatch.setenv("OASR_FAKE_FAIL", order[2])
    with pytest.raises(RuntimeError, match="injected fault"):
        _run_tasks(plan)  # two signatures finish, the third dies half-way
    ckpt = mo.build_options("gemm", "sm90").checkpoint_dir
    assert [read_checkpoint(ckpt, s) is not None for s in order] == [True, True, False, False, False, False]
    logs = mo.pair_dir("sm90", "gemm") / "logs"
    assert len(list(logs.glob(".*.part"))) == 1  # the partial measurement, never taken for a finished one
    monkeypatch.delenv("OASR_FAKE_FAIL")
    plan2 = make_plan(mo)  # resume: only what is missing
    assert [t.signature for t in plan2.archs[0].todo()] == order[2:]
    res = _run_tasks(plan2)
    ends = [e["signature"] for e in _events(fake_env / "events.jsonl") if e["event"] == "end"]
    assert sorted(ends) == sorted(SIGS)  # each signature finished exactly once over both runs
    pub = res[-1]
    assert pub["missing"] == [] and pub["written"] == str(mo.out / "sm90" / "gemm.json")
    recs = [json.loads(x) for x in Path(pub["log"]).read_text().splitlines()]
    per_sig = {s: sum(r["signature"] == s for r in recs) for s in SIGS}
    points = {t.signature: t.points for t in plan.archs[0].measure}
    assert per_sig == {s: 2 * points[s] for s in SIGS}  # two arms a point, the dead attempt's records absent
    assert make_plan(mo).archs[0].todo() == []


def test_matrix_file_equals_the_single_gpu_build(fake_env, monkeypatch):
    monkeypatch.setenv("OASR_ARCH", "sm90")
    c = _census(fake_env / "c.json")
    mo = _options(fake_env, c)
    _run_tasks(make_plan(mo))
    bo = replace(mo.build_options("gemm", "sm90"), out=str(fake_env / "single"), checkpoint_dir=None)
    log = fake_env / "single.jsonl"
    with open(log, "w") as fh:  # as `oasr tune build` does: one log, the model fitted on it
        run_build(load_works([c], "gemm"), bo, "sm90", "sm90_f16_wgmma",
                  lambda w, pts, o, r: matrix_fake.measure(w, pts, o, r, fh, "sm90", "sm90_f16_wgmma"),
                  lambda: (fh.flush(), model_from_log(log, "gemm", "sm90"))[1])
    a = json.loads((mo.out / "sm90" / "gemm.json").read_text())
    b = json.loads((fake_env / "single" / "sm90" / "gemm.json").read_text())
    assert a["entries"] == b["entries"] and len(a["entries"]) == len(SIGS)
    assert cli.main(["tune", "diff", str(fake_env / "single" / "sm90" / "gemm.json"),
                     str(mo.out / "sm90" / "gemm.json")]) == 0


# ------------------------------------------------------------------------------------ a real local Dask cluster

@pytest.mark.slow
def test_local_dask_cluster_survives_a_worker_killed_mid_signature(fake_env, monkeypatch):
    """Two GPU-resource workers and a compile worker (processes under nannies); the fake measurement takes 0.2 s a
    point; the first worker seen measuring is SIGKILLed mid-signature. Dask reschedules its signature, the nanny
    restarts the worker, and the run ends with every signature measured to the end once, nothing duplicated.
    nvcc is a failing stand-in: the compile failure is reported per module and measuring goes on."""
    pytest.importorskip("distributed")
    from oasr_ops.tune.matrix import cluster
    from oasr_ops.tune.matrix.driver import run_matrix

    fake_nvcc = fake_env / "cuda" / "bin" / "nvcc"
    fake_nvcc.parent.mkdir(parents=True)
    fake_nvcc.write_text("#!/bin/sh\necho 'nvcc: injected failure' >&2\nexit 1\n")
    fake_nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(fake_env / "cuda"))
    monkeypatch.setenv("OASR_FAKE_MEASURE_S", "0.2")
    c = _census(fake_env / "c.json")
    mo = replace(_options(fake_env, c), archs=["sm90", "sm80"])  # no worker serves sm80
    plan = make_plan(mo)
    record_run(mo)
    events = fake_env / "events.jsonl"
    killed: dict = {}
    lc = cluster.start_local_cluster(["sm90", "sm90"], cpus=1)
    client = cluster.connect(lc)
    try:
        client.wait_for_workers(3, timeout=120)
        pids = cluster.worker_pids(client)

        def killer() -> None:  # the first measurement seen running: kill its worker process
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not killed:
                for e in _events(events):
                    if e["event"] == "start" and e["pid"] in pids.values():
                        time.sleep(0.3)  # mid-signature (7+ points at 0.2 s)
                        os.kill(e["pid"], signal.SIGKILL)
                        killed.update(e)
                        return
                time.sleep(0.05)
        th = threading.Thread(target=killer, daemon=True)
        th.start()
        summary = run_matrix(client, plan, wait_workers_s=2)
        th.join(5)
    finally:
        client.close()
        lc.close()
    assert killed, "no measurement was seen running"
    ev = _events(events)
    ends = [e["signature"] for e in ev if e["event"] == "end"]
    assert sorted(ends) == sorted(SIGS)  # every signature finished exactly once
    assert not any(e["event"] == "end" and e["pid"] == killed["pid"] and e["signature"] == killed["signature"]
                   for e in ev)
    assert sum(e["event"] == "start" and e["signature"] == killed["signature"] for e in ev) == 2
    s90 = summary["archs"]["sm90"]
    assert s90["ok"] and s90["measured"] == len(SIGS) and s90["compile_failed"] > 0
    doc = database.read_document(mo.out / "sm90" / "gemm.json").doc
    assert sorted(doc["entries"]) == sorted(SIGS)
    run = json.loads((mo.out / "sm90" / "run.json").read_text())
    assert len(run["measure_stage"]["workers"]) >= 2 and run["compile_failed"]
    assert all("nvcc failed" in e for e in run["compile_failed"].values())
    recs = [json.loads(x) for x in (mo.out / "sm90" / "gemm_measurements.jsonl").read_text().splitlines()]
    points = {t.signature: t.points for t in plan.archs[0].measure}
    assert {s: sum(r["signature"] == s for r in recs) for s in SIGS} == {s: 2 * points[s] for s in SIGS}
    assert not summary["archs"]["sm80"]["ok"] and "sm80" in summary["archs"]["sm80"]["failed"]["*"]
    assert not summary["ok"]


def test_oasr_ops_and_its_cli_do_not_import_dask():
    import subprocess

    code = ("import sys, oasr_ops, oasr_ops.cli; oasr_ops.cli.build_parser(); import oasr_ops.tune.matrix.driver, "
            "oasr_ops.tune.matrix.tasks; print(sorted(m for m in ('dask', 'distributed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[1]).stdout
    assert out.strip() == "[]"

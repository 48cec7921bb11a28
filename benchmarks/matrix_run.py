"""`oasr tune matrix` on one multi-GPU host (scripts/device_run.sh step `matrix`; docs/perf/matrix.md).

Four stages, each an `oasr tune matrix` subprocess on a local Dask cluster (kernels already in OASR_JIT_DIR, so
the compile tasks mostly find them):
  one     the census measured with 1 GPU worker              -> <out>/one/sm<arch>/gemm.json
  two     the same with 2 GPU workers (a fresh run id)         -> <out>/two/...
  diff    `oasr tune diff` of the two files, and per census point the cost of serving B's config instead of
          A's, priced by A's own measurements (what "equal up to noise" means here), next to A's sigma/median
  kill    2 GPU workers; when a third of the signatures are checkpointed the GPU worker measuring one is
          SIGKILLed mid-signature (its `.part` log names its pid; Dask reschedules, the nanny restarts it); at
          two thirds the whole client and cluster are killed; `--run-id` then resumes: it must measure only
          the missing signatures, and the published file must hold every signature once.
Everything is logged as JSON under --out (matrix_run.json: the stage summaries, measure-stage wall times, the
speedup, the diff and the resume check). Never hangs: every subprocess has a timeout within --budget-s.

  python3 benchmarks/matrix_run.py --out $OUT/matrix --census benchmarks/census/... [--census ...]
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

T0 = time.monotonic()


def left(budget: float) -> float:
    return budget - (time.monotonic() - T0)


def matrix_cmd(args, out: Path, run_id: str, gpus: int) -> list[str]:
    cmd = [sys.executable, "-m", "oasr_ops", "tune", "matrix", "--family", "gemm", "--out", str(out),
           "--run-id", run_id, "--local-gpus", str(gpus), "--local-cpus", "1", "--thin",
           "--max-points", str(args.max_points), "--max-fill", str(args.max_fill), "--rounds", str(args.rounds)]
    for c in args.census:
        cmd += ["--census", c]
    return cmd + shlex.split(args.matrix_args)


def new_run(out: Path) -> None:
    """Each stage starts from nothing (its own --out): a fresh run, whatever an earlier call left."""
    import shutil

    shutil.rmtree(out, ignore_errors=True)


def run_stage(name: str, cmd: list[str], timeout: float, logdir: Path) -> dict:
    print(f"[{name}] {' '.join(cmd[2:])}", flush=True)
    t = time.monotonic()
    with open(logdir / f"{name}.stderr.log", "w") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=max(timeout, 1))
            rc = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # the client and its cluster's worker processes
            out, _ = p.communicate()
            rc = "timeout"
    wall = time.monotonic() - t
    try:
        summary = json.loads(out[out.index("{"):]) if isinstance(out, str) and "{" in out else None
    except ValueError:
        summary = None
    print(f"[{name}] rc={rc} in {wall:.1f} s", flush=True)
    return {"rc": rc, "wall_s": round(wall, 2), "summary": summary}


def run_report(out: Path, arch: str) -> dict:
    p = out / arch / "run.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def served(entry: dict, m: int) -> str | None:
    for hi, cfg in entry.get("regions", []):
        if hi is None or m <= hi:
            return cfg
    return None


def noise_diff(a_file: Path, b_file: Path, a_log: Path) -> dict:
    """Per census point of A's log: B's served config priced by A's measurements against A's served config."""
    a, b = json.loads(a_file.read_text())["entries"], json.loads(b_file.read_text())["entries"]
    meas: dict = {}
    for line in a_log.read_text().splitlines():
        r = json.loads(line)
        meas.setdefault((r["signature"], r["m"]), {})[r["config"]] = (r["median_s"], r.get("sigma_s", 0.0))
    costs, differ, unpriced, sig_rel = [], 0, 0, []
    for (sig, m), row in meas.items():
        if sig not in a or sig not in b:
            continue
        ca, cb = served(a[sig], m), served(b[sig], m)
        if ca == cb:
            costs.append(0.0)
            continue
        differ += 1
        if ca in row and cb in row:
            costs.append(row[cb][0] / row[ca][0] - 1)
            sig_rel.append(row[ca][1] / row[ca][0])
        else:
            unpriced += 1
    pos = [max(c, 0.0) for c in costs]
    return {"points": len(meas), "served_config_differs": differ, "unpriced": unpriced,
            "b_over_a_geomean": math.exp(sum(math.log1p(c) for c in costs) / len(costs)) - 1 if costs else None,
            "b_over_a_max": max(pos) if pos else None,
            "a_sigma_over_median_at_differing_points_median": sorted(sig_rel)[len(sig_rel) // 2] if sig_rel else None}


def kill_stage(args, out: Path, logdir: Path, budget: float) -> dict:
    new_run(out)
    cmd = matrix_cmd(args, out, "kill", 2)
    res: dict = {"events": []}
    ckpt = out / "runs" / "kill" / args.arch / "gemm" / "ckpt"
    logs = out / "runs" / "kill" / args.arch / "gemm" / "logs"
    with open(logdir / "kill.stderr.log", "w") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        n_sigs = args.n_sigs
        deadline = time.monotonic() + min(budget, left(args.budget_s) - 60)
        worker_killed = False
        while p.poll() is None and time.monotonic() < deadline:
            done = len(list(ckpt.glob("*.json"))) if ckpt.is_dir() else 0
            if not worker_killed and done >= n_sigs // 3:
                parts = list(logs.glob(".*.part")) if logs.is_dir() else []
                if parts:
                    pid = int(parts[0].name.rsplit(".", 2)[-2])
                    os.kill(pid, signal.SIGKILL)
                    worker_killed = True
                    res["events"].append({"t": round(time.monotonic() - T0, 2), "killed_worker": pid,
                                          "mid_signature_log": parts[0].name, "checkpointed": done})
                    print(f"[kill] SIGKILL GPU worker {pid} mid-signature ({done} checkpointed)", flush=True)
            if worker_killed and done >= (2 * n_sigs) // 3:
                os.killpg(p.pid, signal.SIGKILL)
                res["events"].append({"t": round(time.monotonic() - T0, 2), "killed_client": p.pid,
                                      "checkpointed": done})
                print(f"[kill] SIGKILL the client and its cluster ({done} checkpointed)", flush=True)
                break
            time.sleep(0.05)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    res["checkpointed_before_resume"] = len(list(ckpt.glob("*.json"))) if ckpt.is_dir() else 0
    res["resume"] = run_stage("kill-resume", cmd, min(budget, left(args.budget_s) - 20), logdir)
    rep = run_report(out, args.arch)
    fam = rep.get("families", {}).get("gemm", {})
    measured = [r for r in rep.get("measure", []) if not r.get("resumed")]
    res["resumed_signatures"] = fam.get("resumed")
    res["measured_after_resume"] = len(measured)
    f = out / args.arch / "gemm.json"
    entries = json.loads(f.read_text())["entries"] if f.is_file() else {}
    res["signatures_in_file"] = len(entries)
    res["ok"] = (len(entries) == n_sigs and fam.get("resumed", 0) == res["checkpointed_before_resume"]
                 and fam.get("resumed", 0) + len(measured) == n_sigs)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--census", action="append", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--max-points", type=int, default=8)
    ap.add_argument("--max-fill", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=520, help="the whole script's wall-clock budget")
    ap.add_argument("--stages", default="one,two,diff,kill")
    ap.add_argument("--matrix-args", default="", help="more `oasr tune matrix` arguments (a CPU smoke run: "
                                                        "'--measurer matrix_fake:measure --local-archs sm90')")
    args = ap.parse_args()
    args.census = sorted({c for pat in args.census for c in glob.glob(pat)})
    args.out.mkdir(parents=True, exist_ok=True)
    stages = args.stages.split(",")
    from oasr_ops.tune.build import load_works

    args.n_sigs = len(load_works(args.census, "gemm"))
    doc: dict = {"census": args.census, "signatures": args.n_sigs, "max_points": args.max_points,
                 "max_fill": args.max_fill, "rounds": args.rounds, "stages": {}}
    path = args.out / "matrix_run.json"

    def save() -> None:
        path.write_text(json.dumps(doc, indent=1, default=str))

    per = {"one": 0.4, "two": 0.3}
    for name, gpus in (("one", 1), ("two", 2)):
        if name in stages:
            new_run(args.out / name)
            st = run_stage(name, matrix_cmd(args, args.out / name, name, gpus),
                           min(per[name] * args.budget_s, left(args.budget_s) - 30), args.out)
            st["run"] = {k: run_report(args.out / name, args.arch).get(k) for k in ("measure_stage", "warm",
                                                                                  "had_to_compile", "failed")}
            doc["stages"][name] = st
            save()
    one = (doc["stages"].get("one", {}).get("run") or {}).get("measure_stage") or {}
    two = (doc["stages"].get("two", {}).get("run") or {}).get("measure_stage") or {}
    if one.get("wall_s") and two.get("wall_s"):
        doc["measure_stage_speedup_2_vs_1"] = round(one["wall_s"] / two["wall_s"], 3)
        print(f"measure stage: 1 GPU {one['wall_s']:.1f} s, 2 GPUs {two['wall_s']:.1f} s -> "
              f"{doc['measure_stage_speedup_2_vs_1']:.2f}x", flush=True)
    a, b = args.out / "one" / args.arch / "gemm.json", args.out / "two" / args.arch / "gemm.json"
    if "diff" in stages and a.is_file() and b.is_file():
        p = subprocess.run([sys.executable, "-m", "oasr_ops", "tune", "diff", str(a), str(b), "--json"],
                           capture_output=True, text=True, timeout=60)
        doc["diff"] = {"rc": p.returncode, "tune_diff": json.loads(p.stdout) if p.stdout.strip() else None,
                       "noise": noise_diff(a, b, args.out / "one" / args.arch / "gemm_measurements.jsonl")}
        print(f"diff: rc={p.returncode} {json.dumps(doc['diff']['noise'])}", flush=True)
        save()
    if "kill" in stages and left(args.budget_s) > 90:
        doc["stages"]["kill"] = kill_stage(args, args.out / "kill", args.out, left(args.budget_s) - 20)
        print(f"kill/resume: {json.dumps({k: v for k, v in doc['stages']['kill'].items() if k != 'resume'})}",
              flush=True)
    elif "kill" in stages:
        doc["stages"]["kill"] = {"skipped": "not enough of --budget-s left"}
    doc["wall_s"] = round(time.monotonic() - T0, 1)
    save()
    print(f"wrote {path}")
    ok = all(s.get("rc", 0) == 0 for k, s in doc["stages"].items() if k in ("one", "two"))
    return 0 if ok and doc["stages"].get("kill", {}).get("ok", False) else 1


if __name__ == "__main__":
    sys.exit(main())

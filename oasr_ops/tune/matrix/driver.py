"""Submit a planned `oasr tune matrix` run to a Dask client, follow it, write the reports.

Per arch: one compile task per lane (resource ``compile``), one measure task per unfinished signature (resources
``GPU`` and the arch), which depends on its arch's compile tasks only, so an arch starts measuring as soon as its
own compile lands; when the last measure task of an (arch, family) ends, its publish task is submitted. An arch
no worker serves, a failed compile module or a failed signature is reported and the other archs go on.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from ...paths import write_text_atomic
from ..build import checkpoint_path
from . import cluster, tasks
from .plan import ArchPlan, MatrixPlan

log = logging.getLogger("oasr_ops.tune.matrix")


def _key(kind: str, *parts: str) -> str:
    return "-".join(["oasr", kind, *parts])


def _err(fut: Any) -> str:
    try:
        e = fut.exception()
    except Exception as x:  # noqa: BLE001 - a cancelled future has no exception to give
        e = x
    return f"{type(e).__name__}: {e}"


def run_matrix(client: Any, plan: MatrixPlan, wait_workers_s: float = 60.0, warm: bool = True) -> dict[str, Any]:
    """Run `plan` on `client`'s cluster; returns the run summary (also written as each arch's run.json)."""
    from distributed import as_completed

    mo = plan.options
    nonce = f"{mo.run_id}-{time.monotonic_ns() % 10**9}"  # task keys unique on a long-lived scheduler
    archs = [ap for ap in plan.archs if ap.todo() or ap.measure]
    needed = sorted({ap.arch for ap in archs if ap.todo()} | ({cluster.GPU} if any(ap.todo() for ap in archs)
                                                              else set()))
    have = cluster.wait_for_resources(client, needed + [cluster.COMPILE], wait_workers_s)
    t_start = time.time()
    reports: dict[str, dict[str, Any]] = {ap.arch: {"run_id": mo.run_id, "arch": ap.arch, "families": {},
                                                    "compile": [], "measure": [], "failed": {}, "publish": {},
                                                    "skipped": dict(ap.skipped)} for ap in archs}
    futures: dict[Any, tuple[str, str, Any]] = {}  # future -> (kind, arch, what)
    pending: dict[tuple[str, str], int] = {}  # (arch, family) -> measure tasks not finished
    warm_s: dict[str, Any] = {}
    for ap in archs:
        rep = reports[ap.arch]
        todo = ap.todo()
        for fam, lane in ap.lanes.items():
            ts = [t for t in ap.measure if t.family == fam]
            rep["families"][fam] = {"lane": lane, "signatures": len(ts), "resumed": sum(t.done for t in ts)}
        if todo and ap.arch not in have:
            rep["failed"]["*"] = f"no worker advertises the resource {ap.arch} (a GPU of that arch family)"
            log.warning("%s: no worker serves it; skipped", ap.arch)
            continue
        if warm and mo.measurer is None and todo:
            fams = sorted({t.family for t in todo})
            wf = [client.submit(tasks.warm_worker, fams, ap.arch, workers=[w], allow_other_workers=False,
                                pure=False, key=_key("warm", ap.arch, str(i), nonce))
                  for i, w in enumerate(have.get(ap.arch, []))]
            client.gather(wf, errors="skip")  # waits; a worker that fails its warm-up is reported, not fatal
            warm_s[ap.arch] = [f.result() if f.status == "finished" else {"error": _err(f)} for f in wf]
        comp = []
        if cluster.COMPILE in have:
            for c in ap.compile:
                f = client.submit(tasks.compile_modules, ap.arch, c.lane, c.modules, mo.jobs, pure=False,
                                  resources={cluster.COMPILE: 1}, key=_key("compile", ap.arch, c.lane, nonce))
                futures[f] = ("compile", ap.arch, c.lane)
                comp.append(f)
        elif ap.compile:
            rep["compile"].append({"error": "no compile worker (resource 'compile'): the GPU workers compile what "
                                            "the JIT cache lacks (see had_to_compile)"})
        for t in todo:
            opts = mo.build_options(t.family, ap.arch)
            logs = str(mo.pair_dir(ap.arch, t.family) / "logs")
            f = client.submit(tasks.measure_task, t, opts, logs, mo.measurer, comp, pure=False,
                              resources={cluster.GPU: 1, ap.arch: 1}, priority=t.points,
                              key=_key("measure", ap.arch, t.family,
                                       checkpoint_path(opts.checkpoint_dir, t.signature).stem, nonce))
            futures[f] = ("measure", ap.arch, t)
            pending[(ap.arch, t.family)] = pending.get((ap.arch, t.family), 0) + 1
    ac = as_completed(list(futures), loop=client.loop)

    def publish(ap: ArchPlan, fam: str) -> None:
        sigs = [t.signature for t in ap.measure if t.family == fam]
        opts = mo.build_options(fam, ap.arch)
        f = client.submit(tasks.publish_pair, ap.arch, fam, ap.lanes[fam], sigs, opts,
                          str(mo.pair_dir(ap.arch, fam) / "logs"), str(mo.out), pure=False,
                          key=_key("publish", ap.arch, fam, nonce))
        futures[f] = ("publish", ap.arch, fam)
        ac.add(f)

    for ap in archs:  # a pair resumed whole publishes straight away
        for fam in ap.lanes:
            if (ap.arch, fam) not in pending and reports[ap.arch]["failed"].get("*") is None:
                publish(ap, fam)
    by_arch = {ap.arch: ap for ap in archs}
    for f in ac:
        kind, arch, what = futures[f]
        rep = reports[arch]
        ok = f.status == "finished"
        if kind == "compile":
            rep["compile"].append(f.result() if ok else {"lane": what, "error": _err(f)})
            n_failed = len(rep["compile"][-1].get("failed", {}))
            log.info("%s %s: compile %s%s", arch, what, "done" if ok else "FAILED",
                     f" ({n_failed} module(s) failed)" if n_failed else "")
        elif kind == "measure":
            if ok:
                r = f.result()
                rep["measure"].append(r)
                log.info("%s %s: %s on %s", arch, what.signature, "checkpointed earlier" if r["resumed"]
                         else f"{r['points_measured']} points in {r['measure_s']:.1f} s", r["worker"])
            else:
                rep["failed"][what.signature] = _err(f)
                log.warning("%s %s: FAILED %s", arch, what.signature, rep["failed"][what.signature])
            pending[(arch, what.family)] -= 1
            if pending[(arch, what.family)] == 0:
                publish(by_arch[arch], what.family)
        else:
            rep["publish"][what] = f.result() if ok else {"error": _err(f)}
            log.info("%s %s: published %s", arch, what, rep["publish"][what].get("written"))
    return _finish(plan, reports, warm_s, t_start)


def _finish(plan: MatrixPlan, reports: dict[str, dict[str, Any]], warm_s: dict[str, Any],
            t_start: float) -> dict[str, Any]:
    out = Path(plan.options.out)
    summary: dict[str, Any] = {"run_id": plan.options.run_id, "wall_s": round(time.time() - t_start, 3),
                               "archs": {}, "ok": True}
    for arch, rep in reports.items():
        measured = [r for r in rep["measure"] if not r.get("resumed")]
        if measured:
            t0, t1 = min(r["t_start"] for r in measured), max(r["t_end"] for r in measured)
            rep["measure_stage"] = {"start": t0, "end": t1, "wall_s": round(t1 - t0, 3),
                                    "workers": sorted({r["worker"] for r in measured}),
                                    "busy_s": round(sum(r["measure_s"] for r in measured), 3)}
        rep["warm"] = warm_s.get(arch, [])
        rep["had_to_compile"] = sorted({m for r in measured for m in r.get("had_to_compile", [])})
        rep["compile_failed"] = {n: e for c in rep["compile"] for n, e in (c.get("failed") or {}).items()}
        done = all(p.get("written") for p in rep["publish"].values()) and len(rep["publish"]) == len(rep["families"])
        rep["ok"] = done and not rep["failed"]
        summary["ok"] = summary["ok"] and rep["ok"]
        d = out / arch
        d.mkdir(parents=True, exist_ok=True)
        write_text_atomic(d / "compile.json", json.dumps(rep["compile"], indent=1, default=str))
        write_text_atomic(d / "run.json", json.dumps(rep, indent=1, default=str))
        summary["archs"][arch] = {
            "ok": rep["ok"], "measured": len(measured), "resumed": sum(f["resumed"] for f in rep["families"].values())
            + sum(1 for r in rep["measure"] if r.get("resumed")), "failed": rep["failed"],
            "measure_stage_s": rep.get("measure_stage", {}).get("wall_s"), "had_to_compile": len(rep["had_to_compile"]),
            "compile_failed": len(rep["compile_failed"]),
            "files": {f: p.get("written") for f, p in rep["publish"].items()}, "run_report": str(d / "run.json")}
    return summary

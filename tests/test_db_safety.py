"""Tuning data is never lost and big or hostile files stay cheap (issue 12, "Tuning data"): `publish` moves an
unusable file aside instead of replacing it and keeps file modes; entries are validated lazily with one aggregated
warning per file; nesting limits do not depend on the caller's stack depth; config ids have one spelling."""
from __future__ import annotations

import json
import os
import stat
import sys
import warnings

import pytest

from oasr_ops.configs import ConfigError, parse
from oasr_ops.runtime import db_files
from oasr_ops.runtime import validators as val
from oasr_ops.tune import database as db

LANE = "sm90_f16_wgmma"
A, B = "t64x64x64_c1x1_pp", "t128x128x64_c1x1_coop"
SIG = "gemm|op=gemm|dt=half|N=512|K=256"
SIG2 = "gemm|op=gemm|dt=half|N=1024|K=256"


def doc(entries, **extra):
    return {"schema": 2, "kernel_family": "gemm", "arch_family": "sm90", "lane": LANE,
            "validators": val.current_soft_validators(LANE), "configs": {}, "entries": entries, **extra}


def write(path, obj_or_bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(obj_or_bytes if isinstance(obj_or_bytes, bytes) else json.dumps(obj_or_bytes).encode())
    return path


def db_warnings(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(x.message) for x in w if issubclass(x.category, db.TuningDBWarning)]


def umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def nested(depth: int) -> object:
    inner: object = 1
    for _ in range(depth):
        inner = {"x": inner}
    return inner


GOOD = doc({SIG: {"regions": [[None, A]]}})
UNUSABLE = {
    "truncated": json.dumps(GOOD).encode()[:-7],
    "trailing_garbage": json.dumps(GOOD).encode() + b" {}",
    "not_utf8": b"\xff\xfe" + json.dumps(GOOD).encode(),
    "newer_schema": json.dumps({**GOOD, "schema": 3}).encode(),
    "other_lane": json.dumps({**GOOD, "lane": "sm80_f16_mma"}).encode(),
    "too_deep": json.dumps({**GOOD, "model": nested(40)}).encode(),
    "not_an_object": b"[1, 2]",
}


@pytest.mark.parametrize("kind", sorted(UNUSABLE))
def test_publish_moves_an_unusable_file_aside(tuning_env, kind):
    p = write(tuning_env.user / "sm90" / "gemm.json", UNUSABLE[kind])
    p.chmod(0o640)
    _, msgs = db_warnings(lambda: db.publish("gemm", {SIG2: {"regions": [[None, B]]}}))
    aside = [f for f in p.parent.iterdir() if f.name.startswith("gemm.json.corrupt-")]
    assert len(aside) == 1 and aside[0].read_bytes() == UNUSABLE[kind]  # byte for byte, mode untouched
    assert stat.S_IMODE(aside[0].stat().st_mode) == 0o640
    assert len(msgs) == 1 and str(p) in msgs[0] and str(aside[0]) in msgs[0]
    assert list(json.loads(p.read_text())["entries"]) == [SIG2]
    assert stat.S_IMODE(p.stat().st_mode) == 0o644 & ~umask()  # the old mode may be what made it unusable


def test_publish_moves_aside_a_file_over_the_cap_and_a_directory(tuning_env):
    p = tuning_env.user / "sm90" / "gemm.json"
    p.parent.mkdir(parents=True)
    with open(p, "wb") as f:
        f.truncate(db_files.MAX_FILE_BYTES + 1)  # sparse
    _, msgs = db_warnings(lambda: db.publish("gemm", {SIG: {"regions": [[None, A]]}}))
    assert "cap" in msgs[0] and len([f for f in p.parent.iterdir() if ".corrupt-" in f.name]) == 1
    p.unlink()
    p.mkdir()
    (p / "keep").write_text("x")
    db_warnings(lambda: db.publish("gemm", {SIG: {"regions": [[None, A]]}}))
    moved = [f for f in p.parent.iterdir() if ".corrupt-" in f.name and f.is_dir()]
    assert len(moved) == 1 and (moved[0] / "keep").read_text() == "x"  # two moves in a second never clobber
    assert p.is_file()


def test_publish_refuses_when_the_file_cannot_be_moved(tuning_env, monkeypatch):
    p = write(tuning_env.user / "sm90" / "gemm.json", UNUSABLE["truncated"])

    def no_rename(a, b):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "rename", no_rename)
    with pytest.raises(RuntimeError, match="could not be moved aside"):
        db.publish("gemm", {SIG: {"regions": [[None, A]]}})
    monkeypatch.undo()
    assert p.read_bytes() == UNUSABLE["truncated"]
    assert [f.name for f in p.parent.iterdir() if not f.name.endswith(".lock")] == ["gemm.json"]


def test_fresh_publish_still_moves_an_unusable_file_aside(tuning_env):
    p = write(tuning_env.user / "sm90" / "gemm.json", UNUSABLE["newer_schema"])
    db_warnings(lambda: db.publish("gemm", {SIG: {"regions": [[None, A]]}}, fresh=True))
    assert any(f.read_bytes() == UNUSABLE["newer_schema"] for f in p.parent.glob("gemm.json.corrupt-*"))


def test_publish_keeps_the_mode_of_the_file_it_replaces(tuning_env):
    p = db.publish("gemm", {SIG: {"regions": [[None, A]]}})
    assert stat.S_IMODE(p.stat().st_mode) == 0o644 & ~umask()
    for mode in (0o640, 0o664, 0o600):
        p.chmod(mode)
        db.publish("gemm", {SIG2: {"regions": [[None, B]]}})
        assert stat.S_IMODE(p.stat().st_mode) == mode
    assert set(json.loads(p.read_text())["entries"]) == {SIG, SIG2}


def test_publish_keeps_the_old_file_before_dropping_unservable_entries(tuning_env):
    deep = "gemm|op=gemm|dt=half|N=8|K=8"
    before = doc({SIG: {"regions": [[None, A]]}, "gemm|op=gemm|dt=half|N=07|K=8": {"regions": [[None, A]]},
                  "gemm|op=gemm|dt=half|N=8|K=08": {"regions": [[None, A]]},
                  deep: {"regions": [[None, A]], "evidence": nested(40)}})
    p = write(tuning_env.user / "sm90" / "gemm.json", before)
    raw = p.read_bytes()
    _, msgs = db_warnings(lambda: db.publish("gemm", {SIG2: {"regions": [[None, B]]}}))
    kept = list(p.parent.glob("gemm.json.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == raw
    assert len(msgs) == 1 and "2 entries" in msgs[0] and str(kept[0]) in msgs[0]
    after = json.loads(p.read_text())["entries"]
    assert set(after) == {SIG, SIG2, deep} and after[deep]["evidence"] == nested(40)  # deep evidence carried


def test_publish_never_writes_what_readers_would_cut(tuning_env, monkeypatch):
    from oasr_ops.tune import database as writer

    p = db.publish("gemm", {SIG: {"regions": [[None, A]]}})
    raw = p.read_bytes()
    monkeypatch.setattr(writer, "MAX_ENTRIES", 1)
    with pytest.raises(ValueError, match="entry cap"):
        db.publish("gemm", {SIG2: {"regions": [[None, B]]}})
    monkeypatch.setattr(writer, "MAX_ENTRIES", 10)
    monkeypatch.setattr(writer, "MAX_FILE_BYTES", 100)
    with pytest.raises(ValueError, match="byte cap"):
        db.publish("gemm", {SIG2: {"regions": [[None, B]]}})
    assert p.read_bytes() == raw


@pytest.mark.parametrize("bad", ["t64x64x64_c1x1_pp_a8", "t64x64x64_c1x1_pp_s0", "t064x64x64_c1x1_pp",
                                 "t64x64x64_c1x1_pp\n"])
def test_publish_refuses_non_canonical_ids_and_readers_skip_them(tuning_env, bad):
    with pytest.raises(ValueError, match="unknown config id"):
        db.publish("gemm", {SIG: {"regions": [[None, bad]]}})
    write(tuning_env.user / "sm90" / "gemm.json", doc({SIG: {"regions": [[64, bad], [None, A]]}}))
    db.reload()
    (hit, msgs) = db_warnings(lambda: (db.lookup("gemm", "gemm", "fp16", 512, 256, 1, "sm90"),
                                       db.lookup("gemm", "gemm", "fp16", 512, 256, 100, "sm90")))
    assert hit == (None, (A, "user")) and len(msgs) == 1


# ------------------------------------------------------------------------------------------- big files


def _bad_file(path, n_bad, n_good=3):
    entries = {f"gemm|op=gemm|dt=half|N=8|K={8 * (i + 1)}": {"regions": [[None, f"bogus_{i}"]]} for i in range(n_bad)}
    entries.update({f"gemm|op=gemm|dt=half|N=16|K={8 * (i + 1)}": {"regions": [[None, A]]} for i in range(n_good)})
    return write(path, doc(entries))


def test_many_bad_entries_give_one_warning_with_a_count(tuning_env):
    _bad_file(tuning_env.user / "sm90" / "gemm.json", 3000)
    db.reload()
    hit, msgs = db_warnings(lambda: [db.lookup("gemm", "gemm", "half", 8, 8 * (i + 1), 1, "sm90") for i in range(50)]
                            + [db.report()] and db.lookup("gemm", "gemm", "half", 16, 8, 1, "sm90"))
    assert hit == (A, "user")
    assert len(msgs) == 1 and "3000 problem(s)" in msgs[0] and "bogus_0" in msgs[0] and "(+2997 more)" in msgs[0]
    f = db.report()["files"][0]
    assert len(f["problems"]) == 3000 and f["entries"] == 3003  # a bad region is a hole, its entry stays


def test_big_files_are_validated_lazily(tuning_env, monkeypatch):
    monkeypatch.setattr(db_files, "EAGER_ENTRIES", 10)
    _bad_file(tuning_env.user / "sm90" / "gemm.json", 40, n_good=5)
    db.reload()
    lf = db.get_file("user", "sm90", "gemm")
    assert lf.entries._done == {}  # nothing validated before a lookup
    hit, msgs = db_warnings(lambda: db.lookup("gemm", "gemm", "half", 16, 8, 1, "sm90"))
    assert hit == (A, "user") and msgs == [] and len(lf.entries._done) == 1
    _, msgs = db_warnings(lambda: [db.lookup("gemm", "gemm", "half", 8, 8 * (i + 1), 1, "sm90") for i in range(3)])
    assert len(msgs) == 1 and "1 problem(s) in the entries validated so far" in msgs[0]  # warned at the first one
    rep, msgs = db_warnings(db.report)
    assert msgs == [] and len(rep["files"][0]["problems"]) == 40 and rep["files"][0]["entries"] == 45
    assert len(lf.entries) == 45 and set(db.referenced_configs("gemm", "sm90")) == {A}


def test_entries_over_the_cap_are_skipped_with_one_warning(tuning_env, monkeypatch):
    monkeypatch.setattr(db_files, "MAX_ENTRIES", 4)
    write(tuning_env.user / "sm90" / "gemm.json",
          doc({f"gemm|op=gemm|dt=half|N=8|K={8 * (i + 1)}": {"regions": [[None, A]]} for i in range(6)}))
    db.reload()
    hits, msgs = db_warnings(lambda: [db.lookup("gemm", "gemm", "half", 8, 8 * (i + 1), 1, "sm90") for i in range(6)])
    assert hits == [(A, "user")] * 4 + [None] * 2
    assert len(msgs) == 1 and "the last 2 skipped" in msgs[0]


# ---------------------------------------------------------------------------------------------- nesting


def test_publish_onto_deep_evidence_at_any_stack_depth(tuning_env):
    head = json.dumps(doc({SIG2: {"regions": [[None, B]]}}))[:-2]
    data = (head + f', "{SIG}": {{"regions": [[null, "{A}"]], "evidence": ' + '{"x": ' * 900 + "1"
            + "}" * 900 + "}}}").encode()
    p = write(tuning_env.user / "sm90" / "gemm.json", data)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 1200))
    try:
        _at_depth(900, lambda: db.publish("gemm", {"gemm|op=gemm|dt=half|N=8|K=8": {"regions": [[None, A]]}}))
    finally:
        sys.setrecursionlimit(limit)
    assert p.read_text().count('{"x": ') == 900 and not list(p.parent.glob("*.corrupt-*"))


def _at_depth(depth: int, fn):
    return fn() if depth == 0 else _at_depth(depth - 1, fn)


def _load(path):
    lf, rep = db.load_file(path, "user", "sm90", "gemm", LANE, None)
    if lf is not None:
        lf.entries.validate_all()
    return rep.status, rep.reason, list(rep.problems)


@pytest.mark.parametrize("shape", ["entry_900", "file_5000", "header_40", "soft_40", "fine_20"])
def test_nesting_verdict_does_not_depend_on_the_callers_stack(tuning_env, shape):
    if shape == "entry_900":  # built as text: json.dumps itself would recurse 900 deep here
        head = json.dumps(doc({SIG2: {"regions": [[None, B]]}}))[:-2]
        data = (head + f', "{SIG}": {{"regions": [[null, "{A}"]], "evidence": ' + '{"x": ' * 900 + "1"
                + "}" * 900 + "}}}").encode()
    elif shape == "file_5000":
        data = b"[" * 5000 + b"]" * 5000
    elif shape == "soft_40":
        data = json.dumps(doc({SIG: {"regions": [[None, A]], "soft": nested(40)}})).encode()
    elif shape == "header_40":
        data = json.dumps({**GOOD, "model": nested(40)}).encode()
    else:
        data = json.dumps({**GOOD, "model": nested(20)}).encode()
    p = write(tuning_env.user / "sm90" / "gemm.json", data)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 1200))
    try:
        top = _load(p)
        deep = _at_depth(900, lambda: _load(p))
    finally:
        sys.setrecursionlimit(limit)
    assert top == deep
    status, reason, problems = top
    if shape == "soft_40":
        assert status == "loaded" and len(problems) == 1 and "nested deeper than" in problems[0]
    elif shape in ("fine_20", "entry_900"):  # evidence is never served: readers drop it unread
        assert status == "loaded" and problems == []
    else:
        assert status == "skipped" and "nested deeper than 32 levels" in reason


# ------------------------------------------------------------------------------------------- config ids


@pytest.mark.parametrize("bad", [
    "t64x64x64_c1x1_pp\n", " t64x64x64_c1x1_pp", "t64x64x64_c1x1_pp ", "t64x64x64_c1x1_pp_a8",
    "t64x64x64_c1x1_pp_s0", "t64x64x64_c1x1_pp_a0", "t064x64x64_c1x1_pp", "t64x64x64_c01x1_pp",
    "b64x64x64_w32x32x64_s3_k1", "b64x64x64_w32x32x64_s3_k0", "b64x64x64_w32x32x64_s3_a8",
    "b64x64x64_w32x32x64_s3_a0", "b64x64x64_w32x32x64_s03", "b64x64x64_w32x32x64_s3_k04",
    "t\u0666\u0664x64x64_c1x1_pp",  # Arabic-Indic digits
])
def test_non_canonical_ids_are_rejected(bad):
    with pytest.raises(ConfigError):
        parse(bad)


def test_every_accepted_id_is_canonical():
    """Spelling variants of every lane config (suffixes spelt out or zeroed, zero-padded numbers, whitespace):
    whatever `parse` accepts is its config's one id."""
    import re

    from oasr_ops.runtime.registry import LANES

    ids = sorted({c.id for lane in LANES.values() for c in lane.space})
    variants: set[str] = set()
    for cid in ids:
        variants.update({cid, cid + "_k1", cid + "_a8", cid + "_s0", cid + "_k0", cid + "_a0", cid + "\n", cid + " "})
        for m in re.finditer(r"\d+", cid):
            variants.add(cid[:m.start()] + "0" + cid[m.start():])
        variants.add(re.sub(r"_a(\d+)$", "", cid) + "_a8")
    accepted = 0
    for v in sorted(variants):
        try:
            c = parse(v)
        except ConfigError:
            continue
        accepted += 1
        assert c.id == v and parse(c.id) == c
    assert accepted == len(ids)  # exactly the canonical ids

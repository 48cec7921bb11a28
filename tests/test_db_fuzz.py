"""Fuzz the loader with corrupted and hostile tuning files (seeded).

For every variant: no exception escapes a lookup, a region table, a selection or a report; every config that
comes out is a sentinel or a member of the lane's space; and nothing is dropped silently: a skipped file, entry
or region always comes with a warning.
"""
from __future__ import annotations

import copy
import json
import math
import random
import warnings
from types import SimpleNamespace

import pytest

from oasr_ops.runtime.registry import get_lane
from oasr_ops.configs import SENTINELS, parse
from oasr_ops.tune import database as db
from oasr_ops.runtime import select as sel
from oasr_ops.runtime import validators as val

LANE = "sm90_f16_wgmma"
SPACE = set(get_lane(LANE).ids()) | set(SENTINELS)
IDS = ["t64x64x64_c1x1_pp", "t128x128x64_c1x1_coop", "t64x128x64_c1x1_pp", "t128x256x64_c1x1_coop"]
SIGS = [f"gemm|op=gemm|dt={dt}|N={n}|K=256" for dt in ("half", "fp16") for n in (512, 1024)]
HOSTILE = [None, True, False, 0, -1, -(2**70), 2**70, 1e308, -1e308, float("nan"), float("inf"), "", "x",
           "../../x;rm -rf /", "$(reboot)", "t64x64x64_c1x1_pp\n-o /etc/passwd", "default; rm", "\u202e\x00",
           "t64x64x64_c1x1_pp_a4", "b128x128x32_w64x64x32_s4", "t999x64x64_c1x1_pp", [], {}, [[]], {"a": {}},
           [1, 2, 3], "A" * 5000, 512.0, "512"]


def base_doc() -> dict:
    cur = val.current_soft_validators(LANE)
    entries = {}
    for i, sig in enumerate(SIGS):
        regions = [[64 * (i + 1), IDS[i % 4]], [1024, IDS[(i + 1) % 4]]]
        if i % 2:
            regions.append([None, "torch"])
        entries[sig] = {"regions": regions, "evidence": {"M=64": {IDS[0]: [0.01, 0.001, 9]}}, "source": "aot",
                        "notes": ["n"]}
    return {"schema": 2, "kernel_family": "gemm", "arch_family": "sm90", "lane": LANE, "validators": cur,
            "configs": {i: parse(i).to_dict() for i in IDS},
            "entries": entries, "model": {"alpha": 1.0}}


@pytest.fixture
def env(tuning_env):
    path = tuning_env.user / "sm90" / "gemm.json"
    path.parent.mkdir(parents=True)
    return SimpleNamespace(path=path, system=tuning_env.system)


# ------------------------------------------------------------------------------------------- mutations


def _paths(obj, prefix=()):
    """Every (container path) in a JSON document, for wrong-type injection at every level."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _set(doc, path, value):
    if not path:
        return value
    cur = doc
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return doc


def _dump(doc) -> bytes:
    return json.dumps(doc).encode()


def mutate_bytes(rng: random.Random) -> bytes:
    data = bytearray(_dump(base_doc()))
    kind = rng.randrange(4)
    if kind == 0:  # truncation
        return bytes(data[: rng.randrange(len(data))])
    if kind == 1:  # byte flips
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    if kind == 2:  # a chunk deleted
        a = rng.randrange(len(data))
        return bytes(data[:a] + data[a + rng.randint(1, 40):])
    return b"\xff\xfe" + bytes(data)  # not UTF-8


def mutate_types(rng: random.Random) -> bytes:
    doc = base_doc()
    for _ in range(rng.randint(1, 3)):
        p = rng.choice(list(_paths(doc)))
        doc = _set(doc, p, copy.deepcopy(rng.choice(HOSTILE)))
    return json.dumps(doc, allow_nan=True).encode()


def mutate_regions(rng: random.Random) -> bytes:
    doc = base_doc()
    for sig in rng.sample(SIGS, rng.randint(1, len(SIGS))):
        regs = doc["entries"][sig]["regions"]
        op = rng.randrange(6)
        if op == 0:
            rng.shuffle(regs)  # out of order
        elif op == 1:
            regs.insert(rng.randrange(len(regs) + 1), [rng.choice([-5, 0, -(2**63), 2**80, 1.5]), IDS[0]])
        elif op == 2:
            regs.insert(0, [None, IDS[1]])  # catch-all first: the rest is unreachable
        elif op == 3:
            regs[rng.randrange(len(regs))][1] = rng.choice(HOSTILE)
        elif op == 4:
            doc["configs"][rng.choice(IDS)] = {"tile": [64, 64, 64], "kernel_schedule": "pingpong",
                                               "stages": rng.choice([0, 3, "x"])}
        else:
            regs.append([rng.randint(1, 10**6), rng.choice(HOSTILE)])
    return json.dumps(doc, allow_nan=True).encode()


def mutate_structure(rng: random.Random) -> bytes:
    k = rng.randrange(6)
    if k == 0:
        depth = rng.choice([100, 5000, 200000])
        return ("[" * depth + "]" * depth).encode()
    if k == 1:
        doc = base_doc()
        inner: object = 1
        for _ in range(rng.choice([50, 900])):
            inner = {"x": inner}
        doc["entries"][SIGS[0]]["evidence"] = inner
        return _dump(doc)
    if k == 2:
        doc = base_doc()
        doc["entries"]["gemm|op=gemm|dt=half|N=512|K=256;rm"] = {}
        doc["entries"]["../../etc/passwd"] = {"regions": [[None, IDS[0]]]}
        return _dump(doc)
    if k == 3:
        return rng.choice([b"", b"null", b"[]", b"42", b'"str"', b"NaN", b"{}", b'{"schema": 2}'])
    if k == 4:
        doc = base_doc()
        doc["entries"] = {f"gemm|op=gemm|dt=half|N={8 * i}|K=8": {"regions": [[i, IDS[i % 4]]]}
                          for i in range(1, 3000)}
        return _dump(doc)
    doc = base_doc()
    doc["schema"] = rng.choice([1, 3, 2.0, "2", None, True])
    return _dump(doc)


MUTATORS = [mutate_bytes, mutate_types, mutate_regions, mutate_structure]


# ----------------------------------------------------------------------------------------------- checks


def _expected_silent(data: bytes) -> bool:
    """True only when the document is exactly as a clean file: then no warning may appear either."""
    return data == _dump(base_doc())


def _count_raw(data: bytes):
    try:
        doc = json.loads(data)
    except Exception:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), dict):
        return None
    return doc


def exercise(env, data: bytes, rng: random.Random) -> None:
    env.path.write_bytes(data)
    db.reload()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        served = []
        for sig in SIGS:
            parts = db.parse_signature(sig)
            dt = "fp16" if parts.dt == "fp16" else rng.choice(["fp16", "bf16", "half"])
            for m in (1, 64, 65, 1000, 1024, 1025, 10**7, rng.randint(1, 5000)):
                hit = db.lookup("gemm", "gemm", dt, parts.n, parts.k, m, "sm90")
                if hit is not None:
                    served.append(hit[0])
                served.append(sel.select_config("gemm", "gemm", dt, parts.n, parts.k, m).config)
            served.extend(c for _, c in sel.region_table("gemm", "gemm", dt, parts.n, parts.k))
        rep = db.report()
        db.snapshot_hash()
    msgs = [str(x.message) for x in w if issubclass(x.category, db.TuningDBWarning)]
    assert set(served) <= SPACE | {"auto"}, set(served) - SPACE
    assert all(len(m) < 2000 for m in msgs)
    files = [f for f in rep["files"] if f["path"] == str(env.path)]
    assert len(files) == 1
    f = files[0]
    assert "internal error" not in (f["reason"] or ""), f  # every failure is an anticipated, named one
    if f["status"] == "skipped" or f["problems"]:
        assert msgs, f"skipped without a warning: {f}"
    # nothing dropped silently: compare the loaded entries/regions with the raw document
    lf = db.get_file("user", "sm90", "gemm")
    raw = _count_raw(data)
    if lf is None:
        assert f["status"] == "skipped" and msgs
        return
    assert raw is not None
    if len(lf.entries) != len(raw["entries"]):
        assert msgs
    for sig, e in lf.entries.items():
        raw_regions = raw["entries"][sig].get("regions")
        if len(e.regions) != len(raw_regions) or any(c is None for _, c in e.regions):
            assert msgs
    if _expected_silent(data):
        assert not msgs


def test_clean_file_is_silent(env):
    exercise(env, _dump(base_doc()), random.Random(0))
    assert db.get_file("user", "sm90", "gemm") is not None


@pytest.mark.parametrize("mutator", MUTATORS, ids=lambda f: f.__name__)
def test_fuzz(env, mutator):
    rng = random.Random(f"oasr-{mutator.__name__}")
    for _ in range(100):  # 4 x 100 variants
        exercise(env, mutator(rng), rng)


def test_huge_sparse_file(env, monkeypatch):
    # The subject is the size cap: the file is skipped with a warning and selection falls back to the family's
    # policy. The built-in cost-model tier is turned off so that fallback is the lane default ("default").
    monkeypatch.setenv("OASR_TUNE_MODEL_FALLBACK", "0")
    with open(env.path, "wb") as f:
        f.truncate(1 << 30)
    db.reload()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert sel.select_config("gemm", "gemm", "fp16", 512, 256, 1).tier == "default"
    assert any("cap" in str(x.message) for x in w)


def test_nan_and_infinity_in_evidence_are_harmless(env):
    doc = base_doc()
    doc["entries"][SIGS[0]]["evidence"] = {"M=64": [math.nan, math.inf]}
    exercise(env, json.dumps(doc, allow_nan=True).encode(), random.Random(2))
    assert db.get_file("user", "sm90", "gemm").entries[SIGS[0]].regions[0][1] == IDS[0]

"""`oasr tune serving-regions`: (re)derive ``regions_eager`` (tune/serving_regions.py) of a tuning DB file from its
own regions and evidence, for a file built before the build wrote them or with another --floor-us.

A serving host whose torch arm costs less (or more) host time than the one the shipped files were measured on derives
its own into the user tier: `--tier user --seed-from system --floor-us <its time>` copies the system entries the user
file lacks (their regions and evidence unchanged) and derives every entry's field at that floor. The copies then
shadow the system entries (as any user entry does): run it again after upgrading the package."""
from __future__ import annotations

import argparse
import math
from typing import Any

from .database import FileChangedError, db_path, publish
from .serving_regions import HOST_FLOOR_S, with_eager_regions

__all__ = ["derive_file", "register"]


def _read(family: str, arch: str, tier: str) -> tuple[dict[str, Any], str]:
    """The tier's file for (family, arch) and its sha256, checked as `publish` will check it: FileNotFoundError
    without a usable document, ValueError for a header `publish` refuses (another arch, family, lane or schema).
    Such a file would be moved aside by `publish` and replaced by one holding only the changed entries: the
    others lost."""
    from ..runtime.database import expected_lane
    from ..runtime.db_files import header_problem, read_document

    path = db_path(family, arch, tier)
    doc = read_document(path)
    if doc.why is not None or not isinstance(doc.doc, dict):
        raise FileNotFoundError(f"{path}: {doc.why or 'not a tuning DB document'}")
    lane = doc.doc.get("lane")  # what derive_file publishes under (None: the arch's native lane)
    why = header_problem(doc.doc, family, arch, lane if lane is not None else expected_lane(arch, family))
    if why is not None:
        raise ValueError(f"{path}: not a {family} file for {arch} ({why}); nothing written")
    return doc.doc, doc.sha256


def _check_regions(path: Any, sig: str, e: dict[str, Any]) -> None:
    """ValueError naming the file and the entry unless its ``regions`` are rows ``[m_hi, config]`` with m_hi an
    integer >= 1 or null (the rule compares m_hi with the measured Ms)."""
    from ..runtime.db_entries import region_rows_problem

    why = region_rows_problem(e["regions"]) if e.get("regions") is not None else None
    if why is not None:
        raise ValueError(f"{path}: entry {sig!r}: {why}; nothing written")


def derive_file(family: str, arch: str, tier: str = "system", floor_s: float = HOST_FLOOR_S,
                dry_run: bool = False, seed_from: str | None = None,
                attempts: int = 5) -> dict[str, list[list[Any]] | None]:
    """(Re)derive ``regions_eager`` of every entry of a tier's file from its own regions and evidence, and write the
    changed entries back (locked, atomic, under the file's own validators: `tune.database.publish`). With
    `seed_from` (a tier), that tier's entries the file lacks are copied in first (the file is created if absent; the
    validators are the seed file's, whose measurements they are). Returns {signature: new regions_eager or None} for
    the entries written. FileNotFoundError without a file (without the seed's, with `seed_from`).
    The read and the write are not under one lock (`publish` takes it): the write is conditional on the file being
    the one read (`publish(based_on=...)`), and a file changed meanwhile by another writer is read and derived
    again, so no concurrent update is reverted. TimeoutError after `attempts` such races."""
    for _ in range(attempts - 1):
        try:
            return _derive_once(family, arch, tier, floor_s, dry_run, seed_from)
        except FileChangedError:
            continue
    try:
        return _derive_once(family, arch, tier, floor_s, dry_run, seed_from)
    except FileChangedError as e:
        raise TimeoutError(f"{e}, {attempts} times in a row") from None


def _derive_once(family: str, arch: str, tier: str, floor_s: float, dry_run: bool,
                 seed_from: str | None) -> dict[str, list[list[Any]] | None]:
    seed = _read(family, arch, seed_from)[0] if seed_from is not None else None
    try:
        doc, based_on = _read(family, arch, tier)
    except FileNotFoundError:
        if seed is None or db_path(family, arch, tier).exists():
            raise
        doc, based_on = {"lane": seed.get("lane"), "validators": seed.get("validators"), "entries": {}}, "absent"
    entries = doc.get("entries") if isinstance(doc.get("entries"), dict) else {}
    copied = {sig: e for sig, e in ((seed or {}).get("entries") or {}).items()
              if sig not in entries and isinstance(e, dict)}
    if copied and seed.get("lane") != doc.get("lane"):
        raise ValueError(f"--seed-from {seed_from}: its lane {seed.get('lane')!r} is not the file's "
                         f"{doc.get('lane')!r}")
    changed: dict[str, dict[str, Any]] = {}
    for sig, e in {**entries, **copied}.items():
        if isinstance(e, dict):
            _check_regions(db_path(family, arch, seed_from if sig in copied else tier), sig, e)
            new = with_eager_regions(e, floor_s=floor_s)
            if sig in copied or new.get("regions_eager") != e.get("regions_eager"):
                changed[sig] = new
    if changed and not dry_run:
        stamp = doc.get("validators")
        publish(family, changed, tier=tier, arch=arch, lane=doc.get("lane"),
                stamp=stamp if isinstance(stamp, dict) else None, based_on=based_on)
    return {sig: e.get("regions_eager") for sig, e in changed.items()}


def cmd_serving_regions(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..runtime.arch import normalize_arch
    from .build_cli import check_tier_dir

    try:
        arch = normalize_arch(args.arch)
    except ValueError as e:
        raise UsageError(f"--arch {args.arch}: {e}") from None
    # a disabled user tier, a tier path through a regular file: named before anything is read or written
    check_tier_dir(args.tier, arch, "--tier", write=not args.dry_run)
    if args.seed_from is not None:
        check_tier_dir(args.seed_from, arch, "--seed-from", write=False)
    try:
        if not (args.floor_us > 0 and math.isfinite(args.floor_us)):
            raise ValueError(f"--floor-us must be a positive number of microseconds, got {args.floor_us}")
        out = derive_file(args.family, arch, args.tier, args.floor_us * 1e-6, args.dry_run, args.seed_from)
    except (OSError, ValueError, TimeoutError) as e:  # FileNotFoundError included; an OSError of the write
        raise UsageError(str(e)) from None
    for sig, regions in out.items():
        print(f"{sig}: {'no eager regions (the regions serve)' if regions is None else regions}")
    verb = "would change" if args.dry_run else "changed"
    print(f"{len(out)} entr{'y' if len(out) == 1 else 'ies'} {verb}")
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serving-regions", help="derive the regions graphs run without CUDA graphs are served (regions_eager)",
        description="For every entry of a tuning DB file: where its regions serve torch at an M whose measured "
                    "fastest tile takes at most --floor-us, serve that tile to graphs compiled without CUDA graphs "
                    "(launch-bound: the tile's host cost per call is the smaller). Written into the file as each "
                    "entry's regions_eager; `oasr tune build` does this itself.")
    p.add_argument("--family", default="gemm", help="kernel family")
    p.add_argument("--arch", required=True, help="arch family of the file, e.g. sm90")
    p.add_argument("--tier", default="system", help="system, user, or a tier directory")
    p.add_argument("--floor-us", type=float, default=HOST_FLOOR_S * 1e6,
                   help="launch-bound threshold: the largest measured GPU time (us) a tile may take")
    p.add_argument("--seed-from", default=None, metavar="TIER",
                   help="first copy in the entries of this tier's file (e.g. system) that --tier's file lacks: a "
                        "serving host derives its own eager regions into the user tier at its own --floor-us")
    p.add_argument("--dry-run", action="store_true", help="print what would change; write nothing")
    p.set_defaults(func=cmd_serving_regions)

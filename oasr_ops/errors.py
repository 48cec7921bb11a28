"""`UsageError`: a mistake of the user's (a missing file, a bad option value), not a bug of ours.

The one error mechanism of the `oasr` command line (decision): every subcommand validates its whole input
(options, files it reads, where it will write) BEFORE it creates or writes anything, and raises `UsageError`
naming the problem. `oasr_ops.cli.main` catches it in one place, prints ``<prog>: error: <message>`` as one line
on stderr (no traceback) and exits 2; argparse's own errors (an unknown option, a bad choice) take the same
path. Any other exception is a bug and keeps its traceback.

`UsageError` is a `ValueError`, so library callers that catch ValueError for bad input keep working. It lives
at the bottom layer so every layer may raise it; the small checks below are what the subcommands share.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator


class UsageError(ValueError):
    """Bad input from the user: printed as one line by the CLI, exit code 2. `prog` names the command the
    message is for (the CLI fills in the running subcommand when it is None)."""

    def __init__(self, message: str, prog: str | None = None) -> None:
        super().__init__(message)
        self.prog = prog


def existing_file(path: str | os.PathLike[str], what: str) -> Path:
    """`path` as a Path when it is a readable regular file, else UsageError('<what> <path>: <why>')."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{what} {path}: no such file")
    if not p.is_file():
        raise UsageError(f"{what} {path}: not a regular file")
    if not os.access(p, os.R_OK):
        raise UsageError(f"{what} {path}: not readable")
    return p


def json_file(path: str | os.PathLike[str], what: str) -> Any:
    """The parsed JSON document at `path`, or UsageError naming the file and what is wrong with it."""
    p = existing_file(path, what)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"{what} {path}: not UTF-8 text") from None
    except RecursionError:
        raise UsageError(f"{what} {path}: JSON nested too deeply") from None
    except ValueError as e:
        raise UsageError(f"{what} {path}: not valid JSON ({e})") from None
    except OSError as e:
        raise UsageError(f"{what} {path}: unreadable ({e.strerror or e})") from None


def is_int(v: Any) -> bool:
    """A JSON integer (True/False are Python ints, not JSON numbers): the readers of files others write check
    their fields with these two."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    """A JSON number, NaN and infinity included (Python's json reads them): callers bound it as they need."""
    return is_int(v) or isinstance(v, float)


def json_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """(line number, parsed record) of every non-blank line of the JSON-lines file at `path`; ValueError naming the
    file and line for one that is not JSON (or nested too deeply), or the file for bytes that are not UTF-8. The
    strict reader of files a user hands a command (captures, manifests); readers that must skip bad lines, such
    as the recorder's merge, parse for themselves."""
    try:
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except RecursionError:
                    raise ValueError(f"{path}:{i}: JSON nested too deeply") from None
                except ValueError as e:
                    raise ValueError(f"{path}:{i}: not JSON ({e})") from None
                yield i, record
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None


def writable_output(path: str | os.PathLike[str], what: str) -> Path:
    """`path` as a Path when a file can be written there: its directory exists (it is not created: a typo
    must not leave directories behind) and is writable, and `path` is not a directory."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise UsageError(f"{what} {path}: is a directory")
    if not parent.is_dir():
        raise UsageError(f"{what} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{what} {path}: directory {parent} is not writable")
    return p

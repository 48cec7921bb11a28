"""`oasr tune census|build|evaluate|status|diff|prebuild|matrix` — each subcommand lives beside what it drives.

Errors (decision, see `oasr_ops.errors`): a subcommand validates its input before it creates anything and raises
`UsageError`; argparse's own errors are turned into the same exception (`OasrParser.error`). `main` catches it
once, prints ``oasr tune <cmd>: error: <message>`` as ONE line on stderr and returns 2. Any other exception is a
bug of ours and propagates with its traceback.

Output: results (tables, JSON, paths written) go to stdout; diagnostics go through the ``oasr_ops`` logger to
stderr (INFO by default on the command line, ``-v`` for DEBUG, ``-q`` for warnings only); progress bars (tqdm)
go to stderr and only when it is a terminal.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Any

from .errors import UsageError

log = logging.getLogger(__name__)

# Modules that add `oasr tune <name>` subcommands through `register(subparsers)`.
_TUNE_MODULES = ("oasr_ops.tune.census_cli", "oasr_ops.tune.build_cli", "oasr_ops.tune.evaluate",
                 "oasr_ops.tune.status", "oasr_ops.tune.prebuild", "oasr_ops.tune.matrix.cli",
                 "oasr_ops.tune.serving_regions_cli")


# Subcommands whose --arch defaults to OASR_ARCH (then this GPU's): a misspelt OASR_ARCH is their input as much
# as a misspelt --arch, and is named as such before they run (status called it an --arch error, evaluate and
# build raised a traceback from deep in the arch lookup).
_ARCH_FROM_ENV = ("status", "evaluate", "build")


def _check_arch_env(args: argparse.Namespace) -> None:
    if getattr(args, "tune_command", None) not in _ARCH_FROM_ENV or getattr(args, "arch", None) \
            or getattr(args, "default_config", None):  # evaluate --default-config reads no arch
        return
    env = os.environ.get("OASR_ARCH", "").strip()
    if env:
        from .runtime.arch import normalize_arch

        try:
            normalize_arch(env)
        except ValueError as e:
            raise UsageError(f"OASR_ARCH: {e}") from None


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the help already
    says its default or there is none to show (None / False / an empty list: the help says what happens)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if (action.option_strings and "default" not in text.lower() and d is not argparse.SUPPRESS
                and d is not None and d is not False and d != []):
            text += " (default: %(default)s)"
        return text


class _ListFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """`oasr --help`: the subcommand list of the epilog keeps its lines."""


class OasrParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are `UsageError`s (one line through `main`, exit 2) and whose help shows
    defaults. Sub-parsers are of the same class (argparse's add_subparsers default)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see '{self.prog} --help')", prog=self.prog)


def build_parser() -> OasrParser:
    p = OasrParser(prog="oasr", formatter_class=_ListFormatter, description="oasr_ops command line: census a model, tune and inspect the GEMM "
                                             "tuning database, prebuild kernels.")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more diagnostics (-v: debug)")
    p.add_argument("-q", "--quiet", action="count", default=0, help="warnings and errors only")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    tune = sub.add_parser("tune", help="census, build, evaluate and inspect tuning data; prebuild kernels",
                          description="Tuning tools (see docs/tuning.md).")
    tune_sub = tune.add_subparsers(dest="tune_command", required=True, metavar="SUBCOMMAND", title="subcommands")
    for name in _TUNE_MODULES:
        importlib.import_module(name).register(tune_sub)
    # `oasr --help` lists every subcommand with its line, not just `tune`.
    lines = [f"  oasr tune {a.dest:<10s} {a.help}" for a in tune_sub._choices_actions]
    p.epilog = "subcommands:\n" + "\n".join(lines) + "\n\n'oasr tune SUBCOMMAND --help' describes each."
    return p


class _StderrHandler(logging.Handler):
    """Writes records through tqdm.write (a message does not tear a progress bar on the terminal), looking up
    sys.stderr at each record (so a test's captured stream is honoured)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.exc_info:  # e.g. the traceback of a user's model that failed, logged at DEBUG (-v) beside the
            msg += "\n" + self.formatException(record.exc_info)  # one-line error
        if record.levelno >= logging.WARNING:
            return f"oasr: {record.levelname.lower()}: {msg}"
        return f"oasr: {msg}"


_handler: logging.Handler | None = None


def setup_logging(verbosity: int) -> None:
    """The ``oasr_ops`` logger for the command line: INFO (0), DEBUG (>0), WARNING (<0). Idempotent."""
    global _handler
    logger = logging.getLogger("oasr_ops")
    if _handler is not None:
        logger.removeHandler(_handler)
    _handler = _StderrHandler()
    _handler.setFormatter(_Format())
    logger.addHandler(_handler)
    logger.setLevel(logging.DEBUG if verbosity > 0 else logging.INFO if verbosity == 0 else logging.WARNING)
    logger.propagate = False  # the CLI owns the output: no second copy through a root handler


def main(argv: list[str] | None = None) -> int:
    prog = "oasr"
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        prog = f"oasr tune {args.tune_command}" if getattr(args, "tune_command", None) else "oasr"
        setup_logging(args.verbose - args.quiet)
        _check_arch_env(args)
        return int(args.func(args) or 0)
    except UsageError as e:
        print(f"{e.prog or prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`oasr tune diff A B | head`): nothing left to say to it
        try:
            sys.stdout = open(os.devnull, "w")  # Python's own flush at exit would raise again
        except OSError:
            pass
        return 141


if __name__ == "__main__":
    raise SystemExit(main())

"""`oasr tune census|build|evaluate|status|diff|prebuild` — each subcommand lives beside what it drives."""
from __future__ import annotations

import argparse
import importlib
import sys

# Modules that add `oasr tune <name>` subcommands through `register(subparsers)`; a module that is not
# there yet (or fails to import) only loses its subcommands.
_TUNE_MODULES = ("oasr_ops.tune.prebuild", "oasr_ops.tune.build", "oasr_ops.tune.status", "oasr_ops.tune.evaluate",
                 "oasr_ops.tune.census")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="oasr", description="oasr_ops command line")
    sub = p.add_subparsers(dest="command", required=True)
    tune = sub.add_parser("tune", help="census, build, evaluate and inspect tuning data; prebuild kernels")
    tune_sub = tune.add_subparsers(dest="tune_command", required=True)
    for name in _TUNE_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            print(f"oasr: {name} unavailable: {e}", file=sys.stderr)
            continue
        mod.register(tune_sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())

"""`reload_tuning()`'s generic body: a new DB epoch, every family's resolved plans forgotten, and (unless the
caller is inside a compile) every compiled graph dropped, so compiled and eager calls agree.

In the runtime layer so that the tools (`oasr_ops.tune.prewarm`) and the public API (`oasr_ops.reload_tuning`)
share it; torch's compiler is imported only when it is reset (the runtime never imports Dynamo at import time).
"""
from __future__ import annotations

from . import database, registry


def reset_plans() -> None:
    """Forget every family's resolved plans (its ``reset_plans`` handler; plans are keyed by epoch too)."""
    for spec in registry.families().values():
        reset = spec.handler("reset_plans")
        if reset is not None:
            reset()


def reload_tuning(*, reset_compiled: bool = True) -> int:
    """New DB epoch + forget resolved plans (+ drop compiled graphs); returns the new epoch.

    ``reset_compiled=False`` is for a caller inside Dynamo's compile (the backend's prewarm), where compiled
    graphs cannot be reset; the pass's uuid carries the DB hash, so a graph compiled later bakes the new DB.
    """
    epoch = database.reload()
    reset_plans()
    if reset_compiled:
        import torch

        torch.compiler.reset()
    return epoch

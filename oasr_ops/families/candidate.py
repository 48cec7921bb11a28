"""The candidate interface: one thing a tuner can time at a point (Inductor's ``ChoiceCaller``, FlashInfer's
``TunableRunner``). `oasr_ops.tune.candidates` consumes it (build, pruning, prebuild --census, prewarm, autotune); a family
produces it from its registry spec:

    handlers["candidates"](sig_parts, arch) -> list[Candidate]   # every arm of one signature (statically feasible)
    handlers["operands"](point, device, seed, copies=1, like=None) -> Operands   # fresh random inputs + reference

The types live here, in the families layer, so that a family can build them without importing the offline tools
above it; `oasr_ops.tune.candidates` re-exports them. Nothing here imports torch.

A candidate is a config id of the family's native lane, ``torch`` (cuBLAS: a candidate like any other) or a
pseudo-arm (``heuristic``: whatever tile the family's heuristic picks at the point, timed under that name).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

GATES = ("tolerance", "bitwise")


@dataclass(frozen=True)
class Gate:
    """How a candidate's output is judged before it is timed: a tile can launch cleanly and still be wrong.

    kind:      ``tolerance``: finite, and within `factor` x the baseline's (cuBLAS's) own max error against the
               operands' float64 reference (tune.stats.numeric_gate). ``bitwise``: exactly the baseline's bits
               (int8 tiles all compute the same bits: exact int32 accumulation, one rounding).
    baseline:  the id of the candidate the gate compares with (``torch`` / the ``heuristic`` pseudo-arm).
    per_point: gate at every measured point (a bitwise baseline that is a pseudo-arm changes tile with M) instead
               of once per signature at its middle point.
    factor:    the tolerance gate's multiple of the baseline's error.
    """

    kind: str = "tolerance"
    baseline: str = "torch"
    per_point: bool = False
    factor: float = 4.0

    def __post_init__(self) -> None:
        if self.kind not in GATES:
            raise ValueError(f"gate kind must be one of {GATES}, got {self.kind!r}")


@dataclass
class Operands:
    """Fresh random inputs of one point (on one device).

    point:     the point they are shaped for.
    acts:      per-point tensors (activations and their scales), by name.
    consts:    per-signature tensors that are not rotated (bias, weight scales, output scale).
    weights:   the weight copies a measurement rotates through (cold weights: enough copies to exceed L2);
               call j reads copy ``j % len(weights)``.
    reference: float64 reference output of copy 0 (for the tolerance gate), or None where the gate is bitwise.
    variants:  the same inputs as the op is also served them but not timed (e.g. another output dtype of a DB
               without a dtype in its signatures): the gates must pass on each too (`tune.candidates.
               gate_candidates`); only `self` is measured.
    label:     what a variant differs in (named in a rejection's reason).
    """

    point: Any
    acts: dict[str, Any] = field(default_factory=dict)
    consts: dict[str, Any] = field(default_factory=dict)
    weights: list[dict[str, Any]] = field(default_factory=list)
    reference: Callable[[], Any] | None = None
    variants: list["Operands"] = field(default_factory=list)
    label: str = ""

    @property
    def copies(self) -> int:
        return len(self.weights)

    def weight_bytes(self) -> int:
        """Bytes of one weight copy (what the cold/warm decision and the rotation are sized by)."""
        return sum(int(t.numel()) * int(t.element_size()) for t in (self.weights[0].values() if self.weights else ()))


# fn(operands, config, copy) -> zero-arg callable that runs the op once on `operands` (weight copy `copy`)
Binder = Callable[[Operands, str, int], Callable[[], Any]]


@dataclass(frozen=True)
class Candidate:
    """One arm.

    id:         what the measurement table, the log and the DB call it (a config id, ``torch``, ``heuristic``).
    bind:       the family's op call: fn(operands, config, copy) -> zero-arg callable (tensors bound once, so
                the callable costs what the op costs).
    gate:       the numeric gate (see `Gate`).
    resolve:    for a pseudo-arm: fn(point) -> the concrete config it times there (None: the config is `id`).
    infeasible: fn(point) -> why it cannot run at that M (None: it can); static (N, K, arch) infeasibility is
                the factory's business: an infeasible config is never returned.
    host:       the host-issue-cost class charged for the eager part of the build objective (``torch`` /
                ``oasr``), or None: the family's objective is GPU time alone.
    fallback:   the partition's fallback arm (a region names another config only where it beats this one).
    prewarm:    prewarm times it too (gemm: only the compiled production set; a JIT build of the whole space would
                eat the budget).
    """

    id: str
    bind: Binder
    gate: Gate = Gate()
    resolve: Callable[[Any], str] | None = None
    infeasible: Callable[[Any], "str | None"] | None = None
    host: str | None = None
    fallback: bool = False
    prewarm: bool = True

    def config_at(self, point: Any) -> str:
        """The op's config argument at `point` (a pseudo-arm's resolved tile)."""
        return self.resolve(point) if self.resolve is not None else self.id

    def feasible(self, point: Any) -> str | None:
        """None when the candidate can run at `point`, else the reason it cannot."""
        return self.infeasible(point) if self.infeasible is not None else None

    def make_call(self, operands: Operands, copy: int = 0) -> Callable[[], Any]:
        """The zero-arg callable the bench times: one op call on `operands`, weight copy `copy`."""
        return self.bind(operands, self.config_at(operands.point), copy)


def lane_candidates(lane: Any, bind: Callable[..., Any], gate: Gate, n: int, k: int,
                    arch: str, *, fallback: str = "torch") -> list[Candidate]:
    """``torch`` (the vendor library), then every config of `lane` that is statically feasible for (N, K) on
    `arch`, the lane default first; the default and the coverage basis are the cheap ones prewarm may time.
    `lane` None: ``torch`` only. Shared by the families whose arms are plain configs of one lane.
    `fallback`: the partition's fallback arm (and a built entry's catch-all above the measured Ms): ``"torch"``, or
    ``"default"`` — the lane default, for a family whose untuned answer it is (conv1d); ``torch`` when the lane
    default is not feasible for (N, K)."""
    configs = [] if lane is None else [
        c for c in (lane.default, *(c for c in lane.space if c != lane.default))
        if lane.infeasible_reason(c, n=n, k=k, arch_family=arch) is None]
    default_falls_back = fallback == "default" and bool(configs) and configs[0] == lane.default
    out = [Candidate("torch", bind, gate, host="torch", fallback=not default_falls_back)]
    if lane is None:
        return out
    cheap = {lane.default.id, *(c.id for c in lane.coverage_basis)}
    for c in configs:
        out.append(Candidate(
            c.id, bind, gate, host="oasr", prewarm=c.id in cheap, fallback=default_falls_back and c == lane.default,
            infeasible=lambda p, c=c: lane.infeasible_reason(c, m=p.m, n=n, k=k, arch_family=arch)))
    return out

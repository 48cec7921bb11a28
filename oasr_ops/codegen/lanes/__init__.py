"""Lane registry: one module per lane, each exporting `LANE`."""
from __future__ import annotations

from .base import Lane
from .sm80_f16_mma import LANE as SM80_F16_MMA
from .sm80_int8_mma import LANE as SM80_INT8_MMA
from .sm90_f16_bmm import LANE as SM90_F16_WGMMA_BMM
from .sm90_f16_wgmma import LANE as SM90_F16_WGMMA
from .sm90_int8_wgmma import LANE as SM90_INT8_WGMMA

LANES: dict[str, Lane] = {lane.name: lane for lane in (SM80_F16_MMA, SM90_F16_WGMMA, SM80_INT8_MMA, SM90_INT8_WGMMA,
                                                       SM90_F16_WGMMA_BMM)}


def get_lane(name: str) -> Lane:
    try:
        return LANES[name]
    except KeyError:
        raise ValueError(f"unknown lane {name!r}; known: {sorted(LANES)}") from None


def native_lane(arch_family: str, family: str = "gemm") -> Lane | None:
    """The lane a GPU family measures and serves `family` with by default (None if no lane runs there)."""
    for lane in LANES.values():
        if lane.family == family and arch_family in lane.native_for:
            return lane
    return None


__all__ = ["Lane", "LANES", "get_lane", "native_lane"]

"""Config ids round-trip; lanes declare rich, valid spaces; feasibility rules."""
import pytest

from oasr_ops.runtime.registry import LANES, get_lane, native_lane
from oasr_ops.configs import SENTINELS, Config, ConfigError, parse


@pytest.mark.parametrize("lane", LANES.values(), ids=lambda l: l.name)
def test_every_lane_config_round_trips(lane):
    for c in lane.space:
        assert parse(c.id) == c
        assert Config.from_dict(c.to_dict()) == c


@pytest.mark.parametrize("cid", [
    "b128x128x64_w64x64x64_s3", "b64x64x64_w32x32x64_s3_k4", "b32x64x64_w32x32x64_s4_a4",
    "t128x128x64_c2x1_coop", "t64x32x64_c1x1_pp", "t128x128x64_c1x1_sk", "t64x128x64_c1x2_pp_s5",
    "t128x256x128_c2x1_coop_z8_fa", "t128x128x128_c1x1_pp_z2", "t64x16x256_c1x1_pp_z4_fa_swab",
])
def test_id_round_trip(cid):
    assert parse(cid).id == cid
    assert Config.from_dict(parse(cid).to_dict()) == parse(cid)


def test_swizzle_is_omitted_at_its_default():
    c = parse("t128x256x128_c2x1_coop_z8_fa")
    assert c.swizzle == 8 and c.to_dict()["swizzle"] == 8
    assert "swizzle" not in parse("t128x256x128_c2x1_coop_fa").to_dict()  # DB tables stay as they were


@pytest.mark.parametrize("bad", [
    "", "default", "torch", "fused", "auto", "b128x128x64", "t64x64x64_c1x1_coop",  # coop needs M >= 128
    "b128x128x64_w64x48x64_s3",  # warp does not divide
    "t128x128x64_c3x1_pp",  # cluster not a power of two
    "b128x128x64_w64x64x64_s1", "t128x128x64_c1x1_xx", "../../etc/passwd", "b" * 200,
    "t128x128x64_c2x1_coop_k2",  # no split-K in 3.x ids
    "t128x128x64_c1x1_coop_z1", "t128x128x64_c1x1_coop_z3", "t128x128x64_c1x1_coop_z16",  # swizzle 2/4/8 only
    "t128x128x64_c1x1_coop_fa_z8",  # suffix order: _z before _fa
])
def test_bad_ids_rejected(bad):
    with pytest.raises(ConfigError):
        parse(bad)


def test_sentinels():
    assert set(SENTINELS) >= {"default", "torch", "fused"}


def test_lane_spaces_are_rich():
    sm90, sm80 = get_lane("sm90_f16_wgmma"), get_lane("sm80_f16_mma")
    assert len(sm90.space) >= 16 and len(sm80.space) >= 8
    tiles = {c.tile[:2] for c in sm90.space}
    assert (64, 64) in tiles and (64, 32) in tiles
    assert {c.cluster for c in sm90.space} >= {(1, 1, 1), (2, 1, 1)}
    assert {c.kernel_schedule for c in sm90.space} >= {"cooperative", "pingpong"}
    assert any(c.split_k > 1 for c in sm80.space)
    assert native_lane("sm90") is sm90 and native_lane("sm80") is sm80 and native_lane("sm75") is None


def test_split_k_shares_the_kernel():
    c = parse("b64x64x64_w32x32x64_s3_k4")
    assert c.kernel_key() == parse("b64x64x64_w32x32x64_s3")


def test_feasibility_rules():
    sm80, sm90 = get_lane("sm80_f16_mma"), get_lane("sm90_f16_wgmma")
    k4 = parse("b64x64x64_w32x32x64_s3_k4")
    assert sm80.infeasible_reason(k4, m=16, n=256, k=256, arch_family="sm80") is None  # 4 K-tiles
    assert "split_k" in sm80.infeasible_reason(k4, m=16, n=256, k=192, arch_family="sm80")  # 3 K-tiles
    assert "alignment" in sm90.infeasible_reason(sm90.default, m=16, n=260, k=256, arch_family="sm90")
    assert "alignment" in sm90.infeasible_reason(sm90.default, m=16, n=256, k=250, arch_family="sm90")
    assert "does not run" in sm90.infeasible_reason(sm90.default, arch_family="sm80")
    # 256x128x32 x3 stages = 72 KiB fits an A100's 163 KiB but an sm86's 99 KiB only just; 128x256 too
    big = parse("b256x128x32_w64x64x32_s3")
    assert sm80.infeasible_reason(big, arch_family="sm80") is None
    assert sm80.smem_needed(big) == 3 * (256 * 32 + 128 * 32) * 2
    assert sm80.infeasible_reason(parse("t64x64x64_c1x1_pp")) is not None  # another lane's config


def test_bf16_limits_serial_split_k():
    sm80 = get_lane("sm80_f16_mma")
    k4, k2 = parse("b64x64x64_w32x32x64_s3_k4"), parse("b64x64x64_w32x32x64_s3_k2")
    assert "bf16" in sm80.infeasible_reason(k4, k=1024, dtype="bf16")
    assert sm80.infeasible_reason(k4, k=1024, dtype="fp16") is None
    assert sm80.infeasible_reason(k2, k=1024, dtype="bf16") is None

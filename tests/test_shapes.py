import pytest

from oasr_ops.tune.shapes import bucket_of, fill_ladder, fill_points, m_ladder


def test_ladder_rungs():
    assert m_ladder(1024) == [8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128,
                              184, 256, 360, 512, 728, 1024]
    assert m_ladder(5000)[-4:] == [728, 1024, 2048, 4096]
    assert m_ladder(16384)[-1] == 16384
    assert m_ladder(7) == []
    assert all(m % 8 == 0 for m in m_ladder(1 << 20))


@pytest.mark.parametrize("m,bucket", [(1, 8), (8, 8), (9, 16), (127, 128), (128, 128), (129, 184), (184, 184),
                                      (185, 256), (361, 512), (729, 1024), (1024, 1024), (1025, 2048),
                                      (70000, 131072)])
def test_bucket_of(m, bucket):
    assert bucket_of(m) == bucket


def test_bucket_of_rejects_empty():
    with pytest.raises(ValueError):
        bucket_of(0)


def test_fill_points_unbounded():
    # Rungs strictly between 128 and 1024, one below (120) and one above (1448: the fill ladder is x sqrt(2)).
    assert fill_points([128, 1024]) == [120, 184, 256, 360, 512, 728, 1448]
    assert fill_points([128, 1024], margin=0) == [184, 256, 360, 512, 728]
    assert fill_points([128, 1024], max_m=1024) == [120, 184, 256, 360, 512, 728]
    assert fill_points([]) == []


def test_fill_points_bounded_farthest_first():
    # Log distance to the nearest measured point: 360 is farthest (ln(360/128)=1.03), then 184 (ln(184/128) =
    # 0.363, ahead of 512 (0.353), 1448 (ln(1448/1024) = 0.347), 256 and 728 (0.341) once 360 was chosen).
    assert fill_points([128, 1024], max_fill=2) == [184, 360]
    # Hand-traced on a three-point census (see the farthest-point rule in fill_points' docstring).
    assert fill_points([40, 416, 2152]) == [72, 128, 184, 256, 728, 1024, 1448, 2896]
    assert fill_points([40, 416, 2152], max_fill=0) == []


def test_fill_ladder_is_sqrt2_above_1024_and_keeps_the_buckets():
    assert fill_ladder(1024) == m_ladder(1024)
    assert fill_ladder(16384)[-8:] == [1448, 2048, 2896, 4096, 5792, 8192, 11584, 16384]
    assert all(m % 8 == 0 for m in fill_ladder(1 << 20))
    ratios = [b / a for a, b in zip(fill_ladder(1 << 20), fill_ladder(1 << 20)[1:]) if a >= 1024]
    assert max(ratios) < 1.42 and min(ratios) > 1.40
    assert bucket_of(1025) == 2048  # the autotune bucket ladder is unchanged


def test_dense_fill_bounds_the_gap_above_1024():
    # A census with one point per decade above 1024: with enough budget no gap exceeds x sqrt(2) (+ rounding).
    ms = sorted([1024, 16384] + fill_points([1024, 16384], max_fill=32, margin=0))
    assert max(b / a for a, b in zip(ms, ms[1:])) < 1.42

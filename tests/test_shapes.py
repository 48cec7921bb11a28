import pytest

from oasr_ops.tune.shapes import bucket_of, fill_points, m_ladder


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
    # Rungs strictly between 128 and 1024, one below (120) and one above (2048).
    assert fill_points([128, 1024]) == [120, 184, 256, 360, 512, 728, 2048]
    assert fill_points([128, 1024], margin=0) == [184, 256, 360, 512, 728]
    assert fill_points([128, 1024], max_m=1024) == [120, 184, 256, 360, 512, 728]
    assert fill_points([]) == []


def test_fill_points_bounded_farthest_first():
    # Log distance to the nearest measured point: 360 is farthest (ln(360/128)=1.03), then 2048 (ln 2 = 0.69,
    # ahead of 256/512 whose distance shrank to ~0.35 once 360 was chosen).
    assert fill_points([128, 1024], max_fill=2) == [360, 2048]
    # Hand-traced on a three-point census (see the farthest-point rule in fill_points' docstring).
    assert fill_points([40, 416, 2152]) == [72, 96, 128, 184, 256, 728, 1024, 4096]
    assert fill_points([40, 416, 2152], max_fill=0) == []

import pytest
import torch

from oasr_ops.tune.stats import Estimate, estimate, mad, median, numeric_gate, robust_sigma, successive_halving


def test_median_and_mad():
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 3, 2]) == 2.5
    # deviations from 3: [2, 1, 0, 1, 97] -> MAD 1; the outlier does not move it.
    assert mad([1, 2, 3, 4, 100]) == 1
    assert robust_sigma([1, 2, 3, 4, 100]) == pytest.approx(1.4826)
    assert estimate([1.0, 2.0, 3.0, 4.0, 100.0]) == Estimate(3.0, pytest.approx(1.4826), 5)
    assert estimate([5.0]).as_evidence() == [5.0, 0.0, 1]
    with pytest.raises(ValueError):
        median([])


def test_successive_halving_keeps_default_and_incumbent():
    # One outlier sample per round for "a": the median ignores it.
    per_round = {"default": [10.0], "a": [1.0, 1.0, 100.0], "b": [2.0], "c": [3.0], "d": [4.0], "inc": [9.0]}
    calls = []

    def sample_fn(alive):
        calls.append(sorted(alive))
        return {a: per_round[a] for a in alive}

    res = successive_halving(["default", "a", "b", "c", "d", "inc"], sample_fn, rounds=3,
                             keep=("default", "inc", None))
    # Round 0: 4 cuttable arms -> keep 2 (a, b); round 1: 2 -> keep 1 (a); round 2 only refines.
    assert calls == [["a", "b", "c", "d", "default", "inc"], ["a", "b", "default", "inc"], ["a", "default", "inc"]]
    assert res.survivors == ["a", "inc", "default"]
    assert res.best == "a"
    assert res.eliminated_in == {"c": 0, "d": 0, "b": 1}
    assert res.estimates["a"] == Estimate(1.0, 0.0, 9)
    assert res.estimates["default"].n == 3
    assert res.samples["c"] == [3.0]


def test_successive_halving_failed_arm_and_single_round():
    res = successive_halving(["x", "y", "default"], lambda alive: {"y": [2.0], "default": [3.0]}, rounds=1)
    assert res.survivors == ["y", "default"]  # x never produced a sample
    assert res.eliminated_in == {}


def _gemm_case(seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(64, 256, generator=g).half()
    w = torch.randn(96, 256, generator=g).half()
    ref = a.double() @ w.double().t()
    cublas = (a.float() @ w.float().t()).half()
    return a, w, ref, cublas


def test_numeric_gate_accepts_a_correct_arm():
    a, w, ref, cublas = _gemm_case()
    # A different accumulation order (split-K in two halves), rounded to fp16: a correct kernel.
    cand = (a[:, :128].float() @ w[:, :128].float().t() + a[:, 128:].float() @ w[:, 128:].float().t()).half()
    assert numeric_gate(cand, ref, cublas) == (True, "")


def test_numeric_gate_rejects_planted_wrong_arm():
    a, w, ref, cublas = _gemm_case()
    wrong = cublas.clone()
    wrong[5, 7] += 1.0  # one wrong element (a tile that stores to the wrong place, say)
    ok, reason = numeric_gate(wrong, ref, cublas)
    assert not ok and "max abs error" in reason
    # Dropping the last K tile: launches cleanly, is wrong everywhere.
    short_k = (a[:, :192].float() @ w[:, :192].float().t()).half()
    assert numeric_gate(short_k, ref, cublas)[0] is False


def test_numeric_gate_rejects_nan_and_inf_and_shape():
    _, _, ref, cublas = _gemm_case()
    bad = cublas.clone()
    bad[0, 0] = float("nan")
    bad[1, 1] = float("inf")
    assert numeric_gate(bad, ref, cublas) == (False, "non-finite output: 1 NaN, 1 Inf")
    assert numeric_gate(cublas[:, :10], ref, cublas)[0] is False


def test_numeric_gate_floor_when_cublas_is_exact():
    # Integer data: cuBLAS (here: the fp16 of the exact product) has zero error. The floor is one fp16 ulp at the
    # output scale (eps 2^-10 x 1000 ~ 0.98), so an arm rounding one element by an ulp passes, a real error fails.
    ref = torch.arange(1000, dtype=torch.float64).reshape(25, 40)
    cublas = ref.half()
    assert float((cublas.double() - ref).abs().max()) == 0.0
    ulp = cublas.clone()
    ulp[24, 39] += 0.5  # 999 -> 999.5: one fp16 ulp there
    assert numeric_gate(ulp, ref, cublas) == (True, "")
    off = cublas.clone()
    off[3, 3] += 8.0
    ok, reason = numeric_gate(off, ref, cublas)
    assert not ok and "floor 0.976" in reason

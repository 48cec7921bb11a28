"""Reproduce the act-quant epilogue's GELU coefficients (codegen/act_math.py): erf(y / sqrt 2) ~= tanh(y * (A + B x2
+ C x2^2)), x2 = min(y^2, 36), fitted minimax on |GELU_fit - GELU| / max(1, |y|) over |y| <= 6 (Nelder-Mead on an
L^p norm with p rising to 2048, from the tanh-GELU's coefficients), then rounded to fp32 and checked over |y| <= 1e4.
CPU only (numpy, scipy), a few seconds:

  python benchmarks/fit_gelu_tanh_erf.py [--degree 3]
"""
from __future__ import annotations

import argparse

import numpy as np
from scipy.optimize import minimize
from scipy.special import erf

X2_MAX = 36.0


def tanh_arg(c: np.ndarray, y: np.ndarray, clamp: bool) -> np.ndarray:
    x2 = np.minimum(y * y, X2_MAX) if clamp else y * y
    p = np.full_like(y, c[-1])
    for ci in c[-2::-1]:  # Horner in x2
        p = p * x2 + ci
    return y * p


def rel_error(c: np.ndarray, y: np.ndarray, clamp: bool) -> np.ndarray:
    fit = 0.5 * y * (1 + np.tanh(tanh_arg(c, y, clamp)))
    return np.abs(fit - 0.5 * y * (1 + erf(y / np.sqrt(2)))) / np.maximum(1, np.abs(y))


def fit(degree: int) -> np.ndarray:
    y = np.linspace(0, 6.0, 6001)  # the dense check in main() confirms the max between these points
    clamp = degree > 2
    c = np.array([np.sqrt(2 / np.pi), np.sqrt(2 / np.pi) * 0.044715] + [0.0] * (degree - 2))
    for p in (4, 8, 32, 128, 512, 2048):
        c = minimize(lambda c: 1e4 * np.sum(rel_error(c, y, clamp) ** p) ** (1 / p), c, method="Nelder-Mead",
                     options=dict(maxiter=4000, xatol=1e-12, fatol=1e-15)).x
    return c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--degree", type=int, default=3, help="coefficients (2: no clamp needed, 3: act_math's)")
    args = ap.parse_args()
    c = fit(args.degree).astype(np.float32).astype(np.float64)
    y = np.concatenate([np.linspace(0, 12, 1_200_001), np.logspace(np.log10(12), 4, 200_001)])
    err = rel_error(c, y, args.degree > 2)
    print("coefficients (fp32):", [float(v) for v in c])
    print(f"max |GELU_fit - GELU| / max(1, |y|) over |y| <= 1e4: {err.max():.4e} at |y| = {y[err.argmax()]:.3f}")
    tanh_gelu = rel_error(np.array([np.sqrt(2 / np.pi), np.sqrt(2 / np.pi) * 0.044715]), y, False).max()
    print(f"(the tanh-GELU on the same measure: {tanh_gelu:.4e})")


if __name__ == "__main__":
    main()

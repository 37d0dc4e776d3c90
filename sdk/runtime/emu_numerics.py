"""The NPU's numerics that the emulator reproduces and ops.py (the exact oracle) does not: the fits the kernels
in kernels/ evaluate.

GELU's erf on the NPU is Abramowitz & Stegun 7.1.26: erfc(z) = t (a1 + a2 t + ... + a5 t^4) exp(-z^2),
t = 1 / (1 + p z), z >= 0, |error| <= 1.5e-7.
"""
ERFC_P = 0.3275911
ERFC_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)

"""Constants shared by every streaming implementation."""

#: Log-score used for impossible states. Finite (not ``-inf``) so that sums and differences of
#: masked values stay finite and gradients through them are exactly zero instead of NaN.
NEG_INF = -1e9

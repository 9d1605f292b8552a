"""Building blocks shared by the compiled CPU kernels (numba): a vectorisable exp, scaled rings,
guarded log-sum-exp and the Viterbi traceback.

Why the kernels look the way they do (``docs/internals.md`` §8): on a CPU the semi-CRF's cost is
exponentials, K·C of them per position for the duration window and C² for the transition. The
kernels keep every persistent quantity in the log domain (float64, true ``-inf`` for impossible
states) but form the inner products in the *linear* domain, with each operand scaled by a
reference so that it lies in [0, e^MARGIN]:

* a *scaled ring* holds, for each of the last K positions s and each label c, a log value
  ``log[s, c]`` and its scaled exponential ``lin[s, c] = exp(log[s, c] - H[c])`` with a per-label
  reference ``H[c]``. A position's values are exponentiated once, when they enter the ring (C exps),
  instead of once per window they appear in (K·C exps per position);
* a sum of scaled terms that is at least ``TINY`` is exact to far below float64 rounding: every
  term lost to underflow is below ``exp(-708)·e^MARGIN`` (about 1e-280). A sum below ``TINY``
  (forbidden moves, a stale reference) is recomputed exactly in the log domain, so results are
  exact for every input, and fast whenever the model is not degenerate.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

#: A scaled value never exceeds exp(MARGIN): a ring that would is rescaled (K multiplications).
MARGIN = 64.0
#: A linear sum below TINY is recomputed exactly in the log domain.
TINY = 1e-200
#: A label whose ring entries in the window sum to less than LOW is re-referenced from its log values.
LOW = 1e-60

_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
# 1.5 * 2^52: adding it rounds a double to an integer held in the low mantissa bits
_ROUND = 6755399441055744.0


def _bitcast(src, dst):
    """An intrinsic that reinterprets the bits of a ``src`` value as a ``dst`` value of the same width."""

    @intrinsic
    def cast(typingctx, x):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(dst))

        return dst(src), codegen

    return cast


_i64_as_f64 = _bitcast(types.int64, types.float64)
_f64_as_i64 = _bitcast(types.float64, types.int64)


@intrinsic
def fmax(typingctx, a, b):
    """max(a, b) of two float64 as LLVM's maxnum: unlike Python's max, a loop over it vectorises."""
    sig = types.float64(types.float64, types.float64)

    def codegen(context, builder, signature, args):
        d = ir.DoubleType()
        fn = builder.module.declare_intrinsic("llvm.maxnum", [d], ir.FunctionType(d, [d, d]))
        return builder.call(fn, args)

    return sig, codegen


@njit(inline="always", fastmath={"contract"}, error_model="numpy")
def fexp(x):
    """exp(x) to ~4e-16 relative, branch-free so loops over it vectorise; 0 for x < -708 and -inf.

    Only called with x <= MARGIN. Range reduction x = n·ln2 + r, |r| <= ln2/2, then a degree-13
    Taylor polynomial evaluated by Estrin's scheme and a scale by 2^n built from its bits.
    """
    xc = min(max(x, -708.0), 708.0)
    t = xc * _LOG2E + _ROUND
    n = t - _ROUND
    ni = _f64_as_i64(t) - _f64_as_i64(_ROUND)
    r = (xc - n * _LN2_HI) - n * _LN2_LO
    r2 = r * r
    r4 = r2 * r2
    b0 = (1.0 + r) + r2 * (0.5 + r * (1.0 / 6))
    b1 = (1.0 / 24 + r * (1.0 / 120)) + r2 * (1.0 / 720 + r * (1.0 / 5040))
    b2 = (1.0 / 40320 + r * (1.0 / 362880)) + r2 * (1.0 / 3628800 + r * (1.0 / 39916800))
    b3 = 1.0 / 479001600 + r * (1.0 / 6227020800)
    p = (b0 + r4 * b1) + (r4 * r4) * (b2 + r4 * b3)
    y = p * _i64_as_f64((ni + 1023) << 52)
    return y if x >= -708.0 else 0.0


_SQRT2 = 1.4142135623730951
_MANT = 0x000FFFFFFFFFFFFF
_ONE_BITS = 0x3FF0000000000000
_ROUND_BITS = 0x4338000000000000


@njit(inline="always", fastmath={"contract"}, error_model="numpy")
def flog(x):
    """log(x) to ~2e-16 relative for normal x > 0, -inf for x == 0; branch-free so loops vectorise.

    x = 2^e·m with m in [sqrt(1/2), sqrt(2)); log m = 2·atanh(s), s = (m-1)/(m+1), |s| <= 0.172,
    by its odd series to s^21 (Estrin's scheme in s²).
    """
    bits = _f64_as_i64(x)
    e = (bits >> 52) - 1023
    m = _i64_as_f64((bits & _MANT) | _ONE_BITS)
    big = m > _SQRT2
    m = m * 0.5 if big else m
    # the exponent as a double without an int->double conversion (AVX2 has none for int64)
    ef = _i64_as_f64(_ROUND_BITS + (e + 1 if big else e)) - _ROUND
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    z2 = z * z
    z4 = z2 * z2
    a0 = (1.0 + z * (1.0 / 3)) + z2 * (1.0 / 5 + z * (1.0 / 7))
    a1 = (1.0 / 9 + z * (1.0 / 11)) + z2 * (1.0 / 13 + z * (1.0 / 15))
    a2 = (1.0 / 17 + z * (1.0 / 19)) + z2 * (1.0 / 21)
    poly = (2.0 * s) * ((a0 + z4 * a1) + (z4 * z4) * a2)
    y = ef * _LN2_HI + (poly + ef * _LN2_LO)
    return y if x > 0.0 else -np.inf


@njit(inline="always", error_model="numpy")
def lse_update(m, s, x):
    """One step of a streaming log-sum-exp kept as (max m, sum s of exp(. - m)); -inf is skipped."""
    if x == -np.inf:
        return m, s
    if x <= m:
        return m, s + math.exp(x - m)
    if m == -np.inf:
        return x, 1.0
    return x, s * math.exp(m - x) + 1.0


@njit(inline="always", error_model="numpy")
def lse_finish(m, s):
    return -np.inf if m == -np.inf else m + math.log(s)


#: Compile options of every kernel: cached on disk; float division follows IEEE (no Python
#: ZeroDivisionError check, which would also stop loops from vectorising); the GIL is released,
#: so sequences can run on several Python threads at once (:mod:`.engine`).
@njit(inline="always")
def put(dst, src):
    """``dst[:] = src`` for two 1-D arrays of one length, element by element. Numba's array
    assignment also compiles its shape-mismatch error path (a formatted message: 2-4 s of a cold
    compile per process), which these copies of rows never need."""
    for i in range(src.shape[0]):
        dst[i] = src[i]


KERNEL = dict(cache=True, error_model="numpy", nogil=True)
#: Reductions over a window: LLVM may reorder the sum to vectorise it. The order is fixed when the
#: kernel is compiled, so results are still identical from run to run and for any thread count.
REDUCE = dict(KERNEL, fastmath={"reassoc", "contract", "nnan", "nsz"})


# A scaled ring is label-major and doubled: log values logT (C, 2K), scaled values linT (C, 2K) and
# references H (C,). A position's column is written at index r and r + K, so any K consecutive
# ring positions form one contiguous slice [r0, r0 + K) of each label's row.


@njit(**KERNEL)
def prepare_ring(K, C):
    """An empty scaled ring: log values -inf, scaled values 0, references -inf."""
    return np.full((C, 2 * K), -np.inf), np.zeros((C, 2 * K)), np.full(C, -np.inf)


@njit(**KERNEL)
def ring_rebase(logT, linT, H, c):
    """Re-reference label c from its log values: its largest entry becomes 1 (-inf if none is finite)."""
    K2 = logT.shape[1]
    m = -np.inf
    for j in range(K2 // 2):
        m = max(m, logT[c, j])
    H[c] = m
    for j in range(K2):
        v = logT[c, j]
        linT[c, j] = 0.0 if v == -np.inf else fexp(v - m)


@njit(**KERNEL)
def ring_rebase_all(logT, linT, H):
    for c in range(logT.shape[0]):
        ring_rebase(logT, linT, H, c)


@njit(**KERNEL)
def ring_insert(logT, linT, H, r, vals):
    """Write the log values ``vals`` (C,) at ring index r (and its twin r + K) with their scaled exps."""
    C, K2 = logT.shape
    K = K2 // 2
    for c in range(C):
        v = vals[c]
        logT[c, r] = v
        logT[c, r + K] = v
        if v == -np.inf:
            lin = 0.0
        else:
            h = H[c]
            if h == -np.inf or v - h > MARGIN:
                # the new value becomes the reference; older entries shrink (those lost to
                # underflow are negligible next to it, and a sum that needs them is recomputed)
                scale = 0.0 if h == -np.inf else fexp(h - v)
                for j in range(K2):
                    linT[c, j] *= scale
                H[c] = v
                lin = 1.0
            else:
                lin = fexp(v - h)
        linT[c, r] = lin
        linT[c, r + K] = lin


@njit(**KERNEL)
def rebase_low(logT, linT, H, tot):
    """Re-reference every label whose scaled entries in the last window summed (``tot``) to less than LOW."""
    for c in range(logT.shape[0]):
        if tot[c] < LOW:
            ring_rebase(logT, linT, H, c)


# The backward of :mod:`.factored` and :mod:`.direct` keeps a scaled ring (ascending positions) of
# Y_t = S_t + pe_{t-1} + beta_t, by end t; at an end t >= 1 it also writes the end marginals of t-1.


@njit(**KERNEL)
def start_beta_ring(L, S, pe, has_pe, alpha_L, logZ, p_end, YT, linyT, Hy, vals):
    """The sequence end (beta_L = 0): Y_L into the ring and p_end[L-1] = exp(alpha_L - log Z)."""
    C, K2 = YT.shape
    for c in range(C):
        vals[c] = S[L, c] + (pe[L - 1, c] if has_pe else 0.0)
        p_end[L - 1, c] = math.exp(alpha_L[c] - logZ)
    ring_insert(YT, linyT, Hy, L % (K2 // 2), vals)


@njit(**KERNEL)
def push_beta(s, S, pe, has_pe, beta, pend, p_end, YT, linyT, Hy, vals):
    """An end s >= 1 with its beta_s: Y_s into the ring and p_end[s-1] = pend."""
    C, K2 = YT.shape
    for c in range(C):
        p_end[s - 1, c] = pend[c]
        vals[c] = S[s, c] + (pe[s - 1, c] if has_pe else 0.0) + beta[c]
    ring_insert(YT, linyT, Hy, s % (K2 // 2), vals)


# Hot loops index 1-D row views with plain range variables: an index such as ``r + k`` makes numba
# emit a negative-index (wraparound) check per access, which stops LLVM from vectorising the loop.


@njit(**REDUCE)
def window_sums(linT, r, kmax, wT, acc, tot):
    """acc[c] = sum_k linT[c, r+k] · wT[c, k] and tot[c] = sum_k linT[c, r+k], for k < kmax."""
    for c in range(linT.shape[0]):
        row = linT[c, r : r + kmax]
        w = wT[c, :kmax]
        a = 0.0
        m = 0.0
        for k in range(kmax):
            v = row[k]
            a += v * w[k]
            m += v
        acc[c] = a
        tot[c] = m


@njit(**REDUCE)
def window_sums_limited(linT, r, kmax, klim, wT, acc, tot):
    """window_sums with a per-label window: acc[c] sums k < klim[c] only (segment limits, masks);
    tot[c] still sums the whole window k < kmax (it decides when a label's ring is re-referenced)."""
    for c in range(linT.shape[0]):
        row = linT[c, r : r + kmax]
        w = wT[c, :kmax]
        n = klim[c]
        a = 0.0
        m = 0.0
        for k in range(kmax):
            v = row[k]
            a += v * w[k] if k < n else 0.0
            m += v
        acc[c] = a
        tot[c] = m


@njit(inline="always")
def limit_window(lim, has_lim, which, t, kmax, klim):
    """klim[c] = the durations a window may use: kmax, or with segment limits (``lim`` (2, T+1, C):
    [0] the smallest start of a segment ending at t, [1] the largest end of one starting at t)
    ``t - lim[0, t, c]`` (which = 0, a window of segments ending at t) or ``lim[1, t, c] - t``
    (which = 1, segments starting at t), clipped to [0, kmax]."""
    C = klim.shape[0]
    if not has_lim:
        for c in range(C):
            klim[c] = kmax
        return
    row = lim[which, t]
    for c in range(C):
        n = t - row[c] if which == 0 else row[c] - t
        klim[c] = max(0, min(kmax, n))


@njit(inline="always")
def start_window(s, L, K, lim, has_lim, klim):
    """The backward's window of segments starting at s < L: (kmax, r0), its durations and the ring
    index of Y_{s+1}, with klim filled in (:func:`limit_window`)."""
    kmax = min(K, L - s)
    limit_window(lim, has_lim, 1, s, kmax, klim)
    return kmax, (s + 1) % K


@njit(inline="always")
def seq_row(x, b):
    """Sequence b's row of a per-sequence array, or the only row of a (1, ...) dummy."""
    return x[min(b, x.shape[0] - 1)]


@njit(inline="always")
def argmax_first(x):
    """(max, smallest index of the max) of x; (-inf, 0) where every entry is -inf."""
    best, arg = -np.inf, 0
    for i in range(x.shape[0]):
        if x[i] > best:
            best = x[i]
            arg = i
    return best, arg


@njit(inline="always")
def lse_all(x):
    """log-sum-exp of x (-inf where every entry is)."""
    m, s = -np.inf, 0.0
    for i in range(x.shape[0]):
        m, s = lse_update(m, s, x[i])
    return lse_finish(m, s)


@njit(inline="always")
def ring_lse(logT, c, r, n, D):
    """lse_{k < n} (logT[c, r + k] + D[k, c]): a label's duration window summed exactly in the log domain."""
    m, s = -np.inf, 0.0
    for k in range(n):
        m, s = lse_update(m, s, logT[c, r + k] + D[k, c])
    return lse_finish(m, s)


@njit(**KERNEL)
def traceback_seq(bp_k, bp_c, final_label, L, direct, labels, starts):
    """Follow backpointers of one sequence from its end to position 0 (see pytorch_reference.traceback)."""
    t = L
    c = final_label
    while t > 0:
        k = bp_k[t - 1, c] + 1
        s = t - k
        for i in range(s, t):
            labels[i] = c
        starts[s] = True
        c = bp_c[t - 1, c] if direct else bp_c[s, c]
        t = s


@njit(**KERNEL)
def best_path(alpha, L, store, bp_k, bp_c, direct, labels, starts):
    """The best final score of a sequence of length L (ties toward the smallest label) and, with
    ``store``, its segmentation traced back into labels / starts (none for a score of -inf)."""
    score, label = argmax_first(alpha)
    if store and score != -np.inf:
        traceback_seq(bp_k, bp_c, label, L, direct, labels, starts)
    return score

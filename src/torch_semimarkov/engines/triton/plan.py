"""The kernel plan: every launch decision of one call, made once from the problem and the device.

:class:`KernelPlan` says which forward kernel runs (register ring, memory ring, or the direct
recurrence of a (K, C, C) transition), whether the recurrences run parallel over time (chunks with
fix-up) or one program per sequence, the chunk length, warps, tile sizes and the checkpoint layout.
The forward chooses it; the backward, the recompute and Viterbi reuse it, so a backward always
runs the kernels (and reduction orders) its forward ran. The launch choices of the kernels around
the recurrences (marginals, anchors, walks, entropy, sampling, k-best, segment limits) are the
functions and constants at the end of this module.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional, Union

import torch

from torch_semimarkov.engines.triton.common import next_pow2

#: Largest (K_PAD x C_PAD) ring held in registers, per warp count.
REG_RING_ELEMENTS = {1: 1024, 2: 2048, 4: 4096, 8: 8192, 16: 16384}

#: Largest K_PAD of the time-parallel (K, C, C) engine: its fix-up keeps one offset interval per
#: row of the K-row state in registers (two float64 per row). Its state (the last K alpha rows)
#: and the two end states each chunk saves live in memory, so the labels set no limit: a step
#: takes (C_PAD, C_PAD) tiles of the transition, as the sequential kernel's does, and with chunks
#: of at least 4·K the saved end states (2·K·C values a chunk) stay below the stored rows (T·C).
DUR_PARALLEL_MAX_K = 1024

#: Warps of the time-parallel (K, C, C) engine's programs (a (C_PAD, C_PAD) tile a step): 8 from
#: ``DUR_WIDE_C_PAD`` padded labels up, else 4 (GPU_NOTES 102, H100 A/B of 4 against 8 warps,
#: forward+backward / Viterbi: C = 47 -29% / -13%, C = 24 -5% / -5%, C = 8 +8% / +10%).
DUR_PARALLEL_WARPS = 8
DUR_NARROW_WARPS = 4
DUR_WIDE_C_PAD = 32


def dur_parallel_warps(c_pad: int) -> int:
    """Warps of a time-parallel (K, C, C) program for ``c_pad`` padded labels."""
    return DUR_PARALLEL_WARPS if c_pad >= DUR_WIDE_C_PAD else DUR_NARROW_WARPS


#: Tests set this to exercise the memory-ring kernels at small sizes.
FORCE_MEMORY_RING = False

#: Tests set this to a small power of two to exercise the multi-block duration loops.
K_BLOCK_OVERRIDE = None

#: Tests set this to force a chunk length (time-parallel engine) at small sizes.
CHUNK_OVERRIDE: Optional[int] = None

#: Spacing of the log-Z anchors that normalise the marginals of the sequential engine.
ANCHOR_EVERY = 2048

#: The time-parallel engine's anchors: None (default) at its chunk boundaries; an int, at most that
#: many positions apart on a divisor of the chunk length, so that every chunk boundary stays an
#: anchor (probes: whether finer anchors bring the blocked engine's marginals nearer float64,
#: GPU_NOTES 92; each anchor of the blocked engine costs O(K²·C)).
ANCHOR_SPACING: Optional[int] = None

#: Tests set this to run the blocked memory-ring engine (``blocked.py``) at small sizes.
FORCE_BLOCKED = False

#: Tests set this to (BT, RB, CB) to exercise the blocked engine's tiles at small sizes.
BLOCK_OVERRIDE: Optional[tuple] = None

#: The blocked engine's log-semiring block sums as products in linear space (``blocked._tile_linear``):
#: None (default) where the duration bias allows it (dense durations, ``parallel.linear_period``),
#: True always (tests: the underflow recomputation), False never (the term-by-term log-space
#: sums), 1 or 3 always with that period (3: shifts per residue class of the rows, for gene
#: grammars; opt-in, GPU_NOTES 51).
BLOCKED_LINEAR: Optional[Union[bool, int]] = None

#: (BT, RB, CB) of the linear-space block sums: no exponential per term leaves room for larger
#: tiles, whose fewer, longer iterations hide the loads' latency (H200 sweep, GPU_NOTES 43). The
#: products stay per row slot until the rows' loop ends (``blocked._linear_rows``), a (BT, RB, CB)
#: tile of registers: RB = 32 (64 spills); against (64, 16, 16) equal at (4, 10^5, 960, 47) and
#: 13% slower at (32, 3000) (H200, GPU_NOTES 95).
LINEAR_TILE = (32, 32, 16)

#: The blocked engine's marginals (``marginals._blk_seg_kernel``): "tiled" (default: (start,
#: duration, label) tiles, in linear space where exact, else term by term), "log" (tests: every
#: tile term by term) or "position" (the per-position kernel of the register-ring engine).
BLOCKED_MARGINALS = "tiled"

#: (BS, BK, CB) of the blocked engine's marginal tiles: starts, durations, labels.
MARG_TILE = (32, 32, 16)

#: Tests set this to a small (BS, BK, CB) to exercise the marginal tiles at small sizes.
MARG_OVERRIDE: Optional[tuple] = None

#: Warps of the blocked engine's marginal tiles.
MARG_WARPS = 4

#: Warps of the blocked memory-ring engine.
BLOCKED_WARPS = 8

#: A fix-up stops once its last K rows agree with the stored ones up to one offset, every value to
#: within ``tol * (1 + |value|)``: FIXUP_TOL is about 8 float32 ulps of each value.
FIXUP_TOL = 1e-6
#: The blocked engine's log-semiring sums (about 128 ulps). Each value there sums ~K·C terms in
#: blocks, and two runs in different frames round them differently: at K = 960 a row missed
#: FIXUP_TOL now and then, and one such row keeps the window open for K more positions, so the
#: slowest chunk's fix-up ran up to 2.3·K (the minimum is K + 2). With this tolerance every fix-up
#: of the random genomics models stopped at K + 2; log Z, the gradients' distance from float64 and
#: the Viterbi labels did not change (GPU_NOTES 68).
BLOCKED_LOG_TOL = 1.6e-5

#: Tests set this to True / False to force (or forbid) computing beta during the forward
#: (:attr:`KernelPlan.beta_early`); None: the plan's own choice.
BETA_EARLY_OVERRIDE: Optional[bool] = None

#: A batch whose chunks would take several waves of programs runs one chunk per sequence where
#: that is predicted faster (:func:`one_chunk_is_faster`); False: the chunks whatever the waves
#: (A/B switch).
WAVES_RULE = True

#: A forward that will be differentiated may take chunks twice as long, so that the forward's and
#: beta's programs fill the multiprocessors together (:func:`split_chunk_length`); False: the
#: forward's chunks whether or not a backward follows (A/B switch).
BESIDE_SPLIT = True

#: Streaming multiprocessors assumed when no CUDA device is queried (the interpreter; an H100/H200).
DEFAULT_SMS = 132

#: Helper programs per run of the blocked engine (``blocked._blk_help``: they sum a block's older
#: rows while the run steps through the block before it); None: the plan's own choice
#: (:func:`blocked_helpers`), an int forces it (tests, A/B).
HELPERS_OVERRIDE: Optional[int] = None

#: Whether the blocked engine's runs compute their helpers' part themselves instead of launching
#: helper programs (None: on the CPU interpreter, whose programs run one after another; tests set
#: False there to check that a run whose helpers never come goes on alone).
HELP_INLINE: Optional[bool] = None

#: Whether the max semiring's blocked phase A skips a tile whose bound (its largest row plus the
#: largest duration bias it meets) no position's running maximum is below
#: (:attr:`KernelPlan.max_bounds`, ``blocked._tile_exact``): the same scores, labels and argmax
#: durations either way. On: 13-27% off Viterbi at the large random-model shapes, 2% slower at
#: (32, 3000) and on the gene model, whose in-order repair is kept out (GPU_NOTES 87-88).
MAX_BOUNDS: bool = True

#: The phases of the chunked launches (1 spec, 2 fix-up, 3 the in-order repair) that test the
#: bounds of :data:`MAX_BOUNDS`: not the repair, one program a sequence, where a tile's test costs
#: more than it saves (the gene model's repair 17% slower with it, GPU_NOTES 88).
MAX_BOUND_PHASES: tuple = (1, 2)

#: Whether the in-order repair (phase 3: one run a sequence, through the chunks whose fix-up did
#: not converge) takes helper programs of its own (:attr:`KernelPlan.repair_helpers`, the plan's
#: :func:`blocked_helpers` for B runs). On an H200 they took the gene model's forward from 2.61 s to
#: 0.87 s and its Viterbi from 1.25 s to 0.84 s; where the fix-ups converge the repair has nothing to
#: do and nothing changed (GPU_NOTES 89).
REPAIR_HELPERS: bool = True

#: The most helper programs a run takes (each takes a share of the label tiles and of the rows,
#: :func:`helper_split`).
MAX_HELPERS = 6

#: ``(label groups, row parts)`` of the helpers, forced (tests), optionally with the rows of a
#: part, ``(groups, parts, rows)`` (a multiple of the tiles' rows); None: :func:`helper_split`.
HELPER_SPLIT_OVERRIDE: Optional[tuple] = None

#: Rows x label tiles of linear-space block sums that one helper sums in the time its run steps
#: through the positions: where the sums are linear (``blocked._tile_linear``, period 1), a run
#: takes only the helpers it needs (:func:`linear_helpers`). H200, forward ms with 1 / 2 / 3
#: helpers, one label tile or more each (GPU_NOTES 80): (32, 3000, 960, 47) 16.1 / 16.0 / 16.9,
#: (8, 3000) 15.5 / 15.9 / 16.0 (one helper keeps up with 3 tiles x 960 rows), (1, 10^5, 4000, 47)
#: 189 / 135 / 72 (one tile of 4000 rows a helper still sets the pace); the max semiring's
#: term-by-term sums, ~3x dearer, took 3 at K = 960 (23.2 / 15.6 / 13.1).
LINEAR_HELPER_ROWS = 2048


@dataclass(frozen=True)
class KernelPlan:
    """How one call runs on the GPU (see the module docstring).

    Attributes:
        kind: ``"reg"`` factored recurrence with its ring of K_PAD rows in registers, ``"mem"``
            factored with the ring in a per-sequence buffer, ``"dur"`` the direct O(K·C²)
            recurrence of a (K, C, C) transition.
        time_parallel: the recurrences run as chunks of ``chunk`` positions with fix-up (one
            program per (sequence, chunk)) instead of one program per sequence.
        chunk, n_chunks: chunk length W and chunks per sequence (time-parallel), else T and 1.
        num_warps: warps of the recurrence kernels.
        c_pad, k_pad, k_block: label tile, register-ring rows, duration tile of the memory kernels.
        interval, n_checkpoints: the sequential forward's checkpoint spacing and count.
        K: the effective maximum duration min(K, T).
        bt, rb, cb: the blocked memory-ring kernel's tile (``blocked.py``): positions per block,
            ring rows and labels per (BT, RB, CB) tile of its block sums.
        marg, marg_tile, marg_warps: the blocked engine's marginals (:data:`BLOCKED_MARGINALS`),
            their (BS, BK, CB) tile and warps.
        linear, linear_tile: whether the blocked kernel's log-semiring block sums may run as
            products in linear space, and their (BT, RB, CB) tile (None: where the duration
            bias allows; 1 or 3: with that period, ``parallel.linear_period``; unmasked calls
            only; the max semiring and masks sum term by term).
        idx64: positions and row offsets need 64-bit integers (``(T+1)·C`` near 2^31); otherwise
            the kernels index in int32, which is faster (a 64-bit modulo or multiply per element
            costs a large batch up to 2x).
        beta_early: a forward that saves for its backward also runs the beta recurrence (it does not
            depend on the forward), on a second CUDA stream beside the forward, and the backward
            runs only the marginal kernels (:func:`beta_early`). Its rows are then held from the
            forward to the backward: the saved state is half as large again (B·(T+1)·C float32
            and B·(T+1) float64 more).
        helpers: programs beside each run of the blocked engine that sum its blocks' older rows
            (:func:`blocked_helpers`).
        max_bounds: the max semiring's blocked phase A skips the tiles its bounds rule out
            (:data:`MAX_BOUNDS`; ``parallel.max_bound_table``): the same outputs either way.
        max_bound_phases: the chunk phases (1 spec, 2 fix-up, 3 repair) that test them.
        repair_helpers: helper programs beside each run of the in-order repair (B runs, so more
            than the spec's B·n runs leave room for; :data:`REPAIR_HELPERS`; none for one chunk).
    """

    kind: str
    time_parallel: bool
    chunk: int
    n_chunks: int
    num_warps: int
    c_pad: int
    k_pad: int
    k_block: int
    interval: int
    n_checkpoints: int
    K: int
    idx64: bool = False
    bt: int = 16
    rb: int = 32
    cb: int = 16
    linear: Optional[Union[bool, int]] = False
    linear_tile: tuple = LINEAR_TILE
    marg: str = "position"
    marg_tile: tuple = MARG_TILE
    marg_warps: int = MARG_WARPS
    beta_early: bool = False
    helpers: int = 0
    max_bounds: bool = False
    max_bound_phases: tuple = (1, 2)
    repair_helpers: int = 0

    @property
    def packed_backpointers(self) -> bool:
        """The max-semiring kernels pack (k, c_prev) into one int32 per (t, c) (the register-ring
        kernels and every time-parallel one)."""
        return self.kind == "reg" or self.time_parallel


def tile_sizes(C: int, K_eff: int):
    """(C_PAD, K_BLOCK): a (K_BLOCK, C_PAD) tile holds at most 4096 elements."""
    c_pad = max(4, next_pow2(C))
    k_block = max(2, min(next_pow2(K_eff), max(16, 4096 // c_pad)))
    if K_BLOCK_OVERRIDE is not None:
        k_block = K_BLOCK_OVERRIDE
    return c_pad, k_block


def ring_warps(k_pad: int, c_pad: int, fewest: int = 4) -> int:
    """The fewest warps, from ``fewest``, whose register budget (:data:`REG_RING_ELEMENTS`) holds a
    (K_PAD, C_PAD) ring (16 where none does)."""
    return next((w for w in (1, 2, 4, 8, 16) if w >= fewest and k_pad * c_pad <= REG_RING_ELEMENTS[w]), 16)


def use_register_ring(C: int, K_eff: int, num_warps: int, B: int = 1) -> bool:
    """Register ring for a small (K_PAD, C_PAD) ring; the memory ring for large rings and for
    large batches of large rings (register pressure then costs more occupancy than it saves)."""
    if FORCE_MEMORY_RING:
        return False
    elems = max(2, next_pow2(K_eff)) * max(4, next_pow2(C))
    if B >= 256 and elems >= 2048:
        return False
    return elems <= REG_RING_ELEMENTS.get(num_warps, 4096) and C < 65536


def auto_num_warps(B: int, C: int, K_eff: int, duration_transitions: bool = False, semiring: str = "log") -> int:
    """Warps per program for the sequential kernels, from the H200 sweep in benchmarks/GPU_NOTES.md:
    one program per sequence is latency-bound below a few hundred sequences (more warps shorten a
    step for large rings) and throughput-bound above."""
    if duration_transitions:
        return 4
    c_pad = max(4, next_pow2(C))
    elems = max(2, next_pow2(K_eff)) * c_pad
    if B >= 256:
        return 4
    if elems <= 256:
        return 1 if (c_pad <= 4 or semiring == "max") else 4
    return 8


def resolve_interval(T: int, K: int, checkpoint_interval: Optional[int]) -> int:
    """Positions between checkpoints: ``max(K, sqrt(T·K))`` by default, clamped to [1, T]."""
    interval = checkpoint_interval or max(K, int(math.sqrt(T * K)), 1)
    return max(1, min(int(interval), max(T, 1)))


def checkpoint_sizes(kind: str, C: int, K_eff: int):
    """Per-checkpoint float32 and float64 element counts of each kernel's restart state."""
    c_pad = max(4, next_pow2(C))
    if kind == "reg":
        k_pad = max(2, next_pow2(K_eff))
        return k_pad * c_pad + c_pad, k_pad + 1
    if kind == "mem":
        return K_eff * C + c_pad, K_eff + 1
    return K_eff * C, K_eff


def _sms(device) -> int:
    if device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_SMS


def chunk_length(B: int, T: int, K_eff: int, sms: int) -> int:
    """Chunk length W of the time-parallel engine: enough chunks for about four programs per
    multiprocessor, each at least 4·K long (a fix-up needs about K to a few K positions) and at
    least 64."""
    if CHUNK_OVERRIDE is not None:
        return max(int(CHUNK_OVERRIDE), K_eff)
    want = max(1, -(-4 * sms // max(B, 1)))
    return max(4 * K_eff, 64, -(-T // want))


def _blocked_chunk(T: int, K_eff: int, programs: int, B: int, longest: int) -> int:
    """A blocked-engine chunk for about ``programs`` programs over B full-length sequences: at
    least 1.5·K and 64 long, at most ``longest``."""
    per = max(1, programs // max(B, 1))
    return max(3 * K_eff // 2, 64, min(longest, -(-T // per)))


def blocked_chunk_length(B: int, T: int, K_eff: int, sms: int) -> int:
    """Chunk length W of the blocked memory-ring engine: about one program per multiprocessor
    for a batch of full-length sequences, each chunk at least 1.5·K and 64 long and at most 4·K
    (a ragged batch's long sequences then still take many chunks)."""
    if CHUNK_OVERRIDE is not None:
        return max(int(CHUNK_OVERRIDE), K_eff)
    return _blocked_chunk(T, K_eff, sms, B, 4 * K_eff)


def split_chunk_length(B: int, T: int, K_eff: int, sms: int) -> Optional[int]:
    """Chunk length of a differentiated forward in the blocked engine whose usual chunks (about one
    program per multiprocessor, :func:`blocked_chunk_length`) leave no room for beta beside it:
    chunks for half the multiprocessors each (at most 8·K, so a long sequence in a ragged batch
    waits no longer than for the forward and beta of 4·K chunks one after the other), or None where
    the two recurrences' ``2 · B · n_chunks`` programs would still not fit in one wave. The forward
    then takes about ``W + K`` steps and beta runs in the same time, instead of ``2 · (W/2 + K)``."""
    W = _blocked_chunk(T, K_eff, sms // 2, B, 8 * K_eff)
    n = -(-T // W)
    return W if 2 * B * n <= sms else None


def one_chunk_is_faster(B: int, T: int, K_eff: int, W: int, n: int, sms: int, margin: float = 0.75) -> bool:
    """Whether a batch of B sequences padded to T should run one chunk per sequence instead of
    ``n`` chunks of ``W`` in the blocked engine, at one program per multiprocessor. Chunks cost
    ``waves · (W + K)`` steps (a fix-up runs about K positions, a repair more), one chunk
    ``ceil(B / sms) · T``. The chunks are kept unless one chunk is cheaper by ``margin`` (in a
    ragged batch the chunks past a short sequence's end cost nothing, which this padded estimate
    does not see), e.g. 128 gene loci of 3-5.3 kb: 256 programs in two waves of 3,840 + 960 steps
    against one wave of 5,318."""
    waves = -(-B * n // sms)
    return waves > 1 and -(-B // sms) * T <= margin * waves * (W + K_eff)


def beta_early(B: int, n_chunks: int, sms: int, semiring: str, on_cuda: bool) -> bool:
    """Whether the blocked engine's forward should run beta beside it: in the log semiring on a GPU
    whose multiprocessors the two recurrences' programs (one 8-warp program per multiprocessor,
    ``B · n_chunks`` each) fill at most once together, e.g. a batch of 32 sequences of 3,000
    positions (one chunk each) on 132 multiprocessors. Where the forward alone fills the GPU, beta
    would only queue behind it. :data:`BETA_EARLY_OVERRIDE` forces the answer (tests)."""
    if BETA_EARLY_OVERRIDE is not None:
        return bool(BETA_EARLY_OVERRIDE)
    return semiring == "log" and on_cuda and 2 * B * n_chunks <= sms


def blocked_helpers(B: int, n_chunks: int, C: int, sms: int, beside: bool, on_cuda: bool) -> int:
    """Helper programs per run of the blocked engine (``blocked._blk_help``). A run's step is
    its block sums over the K older rows (phase A) and then BT sequential positions (phase B);
    helpers sum the rows older than the previous block for the next block while the run steps,
    so phase A leaves the run's critical path. They use the multiprocessors the runs leave idle
    (one 8-warp program each; ``beside``: beta's runs beside the forward's take as many), at most
    :data:`MAX_HELPERS` (they split the label tiles and the rows, :func:`helper_split`); none off
    CUDA, where programs run one after another. :data:`HELPERS_OVERRIDE` forces the answer."""
    if HELPERS_OVERRIDE is not None:
        return int(HELPERS_OVERRIDE)
    if not on_cuda:
        return 0
    runs = B * n_chunks * (2 if beside else 1)
    return max(0, min(sms // max(runs, 1) - 1, MAX_HELPERS))


def helper_split(helpers: int, tiles: int, K: int, rows: int) -> tuple:
    """``(groups, parts)``: how ``helpers`` split a block's sums over ``tiles`` label tiles and K
    old rows (tiles of ``rows``): helper h takes the label tiles h mod groups, + groups, ... and
    the rows of part h // groups (consecutive rows, a whole number of tiles each). The split
    whose busiest helper has the least work (label tiles / parts), then the fewest helpers, then
    the most groups (a label split needs no combination of parts): 3 tiles and 3 helpers (3, 1),
    2 helpers (1, 2) (1.5 tiles each, not 2 and 1), 6 helpers (3, 2). Returns (0, 1) for none.
    :data:`HELPER_SPLIT_OVERRIDE` forces it."""
    if HELPER_SPLIT_OVERRIDE is not None:
        return tuple(HELPER_SPLIT_OVERRIDE)[:2]
    if helpers <= 0:
        return 0, 1
    max_parts = max(1, -(-K // rows))
    best = None
    for g in range(min(helpers, tiles), 0, -1):
        r = min(helpers // g, max_parts)
        key = (-(-tiles // g) / r, g * r)
        if best is None or key < best[0]:
            best = (key, g, r)
    return best[1], best[2]


def helper_part_rows(parts: int, K: int, rows: int) -> int:
    """Rows of each of the helpers' ``parts`` row parts (:func:`helper_split`): K split evenly,
    rounded up to whole tiles of ``rows`` (the last part ends at K); :data:`HELPER_SPLIT_OVERRIDE`'s
    third value where it has one."""
    if HELPER_SPLIT_OVERRIDE is not None and len(HELPER_SPLIT_OVERRIDE) > 2:
        n = int(HELPER_SPLIT_OVERRIDE[2])
        if n % rows:
            raise ValueError(f"HELPER_SPLIT_OVERRIDE: rows of a part ({n}) must be a multiple of {rows}")
        return n
    if parts <= 1:
        return K
    per_part = -(-K // parts)
    return -(-per_part // rows) * rows


def linear_helpers(helpers: int, K: int, tiles: int) -> int:
    """Helpers a run of linear-space block sums (period 1) takes of the plan's ``helpers``: enough
    for its ``tiles`` label tiles of K rows at :data:`LINEAR_HELPER_ROWS` each, at least one; a
    helper more only adds its handshakes. :data:`HELPERS_OVERRIDE` keeps the forced count."""
    if HELPERS_OVERRIDE is not None or helpers <= 1:
        return helpers
    return min(helpers, max(1, -(-tiles * K // LINEAR_HELPER_ROWS)))


def anchor_spacing(plan: "KernelPlan", T: int) -> int:
    """Positions between the backward's log-Z anchors (``launch.launch_backward``): the chunk length
    of the time-parallel engine (its chunk boundaries, where the fix-ups' offsets change), or its
    largest divisor of at most :data:`ANCHOR_SPACING` where that is set; :data:`ANCHOR_EVERY`
    (at most T) for one program per sequence."""
    if not plan.time_parallel:
        return min(max(T, 1), ANCHOR_EVERY)
    W = plan.chunk
    if ANCHOR_SPACING is not None and ANCHOR_SPACING < 1:
        raise ValueError(f"plan.ANCHOR_SPACING must be a positive number of positions, got {ANCHOR_SPACING}")
    if ANCHOR_SPACING is None or W <= ANCHOR_SPACING:
        return W
    return next(W // m for m in range(2, W + 1) if W % m == 0 and W // m <= ANCHOR_SPACING)


def fixup_tol(plan: "KernelPlan", semiring: str) -> float:
    """The fix-ups' convergence tolerance (:data:`FIXUP_TOL`, or :data:`BLOCKED_LOG_TOL` for the
    blocked engine's log semiring; its max semiring, whose backpointers pick among near-ties,
    keeps the tight one)."""
    if plan.kind == "mem" and plan.time_parallel and semiring == "log":
        return BLOCKED_LOG_TOL
    return FIXUP_TOL


def make_plan(
    B: int,
    T: int,
    K: int,
    C: int,
    *,
    duration_transitions: bool = False,
    semiring: str = "log",
    num_warps: Optional[int] = None,
    time_parallel: Optional[bool] = None,
    checkpoint_interval: Optional[int] = None,
    device=None,
    backward: bool = False,
) -> KernelPlan:
    """The plan of one call.

    Args:
        B, T, K, C: batch, padded length, maximum duration, labels.
        duration_transitions: the transition is (K, C, C).
        semiring: ``"log"`` or ``"max"``.
        num_warps: force the warps of the recurrence kernels (None: by size).
        time_parallel: True / False force the engine; None (default) runs parallel over time when
            the batch alone cannot fill the GPU and the sequences are long enough to cut.
        checkpoint_interval: the sequential forward's checkpoint spacing (None: sqrt(T·K)).
        device: the device the call runs on (its multiprocessor count sizes the chunks).
        backward: the forward will be differentiated (its backward makes the plan with the same
            flag): the blocked engine may then cut longer chunks to run beta beside the forward
            (:func:`split_chunk_length`), and runs beta beside it only then
            (:attr:`KernelPlan.beta_early`); a plain forward's runs take the helpers beta would.
    """
    K_eff = max(1, min(int(K), T))
    c_pad, k_block = tile_sizes(C, K_eff)
    k_pad = max(2, next_pow2(K_eff))
    if duration_transitions:
        kind = "dur"
        warps = num_warps if num_warps is not None else auto_num_warps(B, C, K_eff, True, semiring)
    else:
        warps = num_warps if num_warps is not None else auto_num_warps(B, C, K_eff, False, semiring)
        kind = "reg" if use_register_ring(C, K_eff, warps, B) else "mem"
    sms = _sms(device)
    W = chunk_length(B, T, K_eff, sms)
    n = max(1, -(-T // W))
    # the time-parallel engine runs the register-ring kernel for a (C, C) transition (several
    # programs share a multiprocessor, so 4 warps unless the ring needs more) and the direct
    # recurrence, its K-row state in memory, for a (K, C, C) one
    par_warps = num_warps
    if duration_transitions:
        par_warps = par_warps or dur_parallel_warps(c_pad)
        supported = k_pad <= DUR_PARALLEL_MAX_K
        limit = f"K_PAD <= {DUR_PARALLEL_MAX_K} for a (K, C, C) transition"
    else:
        if par_warps is None:
            par_warps = ring_warps(k_pad, c_pad)
        supported = use_register_ring(C, K_eff, par_warps, 1)
        limit = f"a ring of at most {REG_RING_ELEMENTS[16]} padded elements (K_PAD x C_PAD) for a (C, C) transition"
    interval = resolve_interval(T, K_eff, checkpoint_interval)
    idx64 = (T + 1) * max(C, K_eff) * 4 >= 2**31
    if not duration_transitions and time_parallel is not False and (
            FORCE_BLOCKED or k_pad * c_pad > REG_RING_ELEMENTS[16]):
        # a ring too large for registers: the blocked memory-ring engine, one program per
        # multiprocessor (8 warps, ~200 registers a thread), parallel over time with chunks of
        # at least 1.5·K (a fix-up runs ~1.0-1.2·K positions); sequences shorter than 4·K, or a
        # batch that fills the GPU alone, run one chunk per sequence (H200 sweep, GPU_NOTES)
        W = blocked_chunk_length(B, T, K_eff, sms)
        n = max(1, -(-T // W))
        on_cuda = device is not None and torch.device(device).type == "cuda"
        if (B >= sms or T < 4 * K_eff) and time_parallel is None and CHUNK_OVERRIDE is None:
            W, n = max(T, 1), 1
        elif (WAVES_RULE and time_parallel is None and CHUNK_OVERRIDE is None
              and one_chunk_is_faster(B, T, K_eff, W, n, sms)):
            W, n = max(T, 1), 1
        elif (backward and BESIDE_SPLIT and BETA_EARLY_OVERRIDE is None and CHUNK_OVERRIDE is None and on_cuda
              and semiring == "log" and 2 * B * n > sms):
            # the forward's chunks fill the GPU: beta would queue behind it unless the chunks grow
            W_split = split_chunk_length(B, T, K_eff, sms)
            if W_split is not None:
                W, n = W_split, -(-T // W_split)
        # the term-by-term block sums' tile: 32 labels wide in the log semiring (gene grammars and
        # masks: the gene finder's step 4% faster, outputs bitwise equal), 16 in the max semiring
        # (Viterbi: 32 was 14% slower); H200, GPU_NOTES 52. Viterbi over several chunks takes blocks
        # of 32 positions (each old row loaded once for twice as many positions: (4, 10^5, 960, 47)
        # 40.4 -> 33.8 ms, (16, 20000) 36.0 -> 29.5, the gene model 930 -> 852; random models' outputs
        # bitwise those of 16 since phase B sums in the previous position's frame); one chunk a
        # sequence keeps 16 ((32, 3000): 14.6 -> 15.7 ms with 32; its phase B is the critical path);
        # GPU_NOTES 94
        bt = 32 if semiring == "max" and n > 1 else 16
        bt, rb, cb = BLOCK_OVERRIDE or (bt, 32, min(32 if semiring == "log" else 16, c_pad))
        # beside only where a backward follows (a plain forward would count beta's runs and give
        # its own runs fewer helpers: (1, 10^5, 4000, 47) took 2 helpers and 132 ms, not 3 and
        # 72; GPU_NOTES 80)
        early = backward and beta_early(B, n, sms, semiring, on_cuda)
        return KernelPlan(
            kind="mem", time_parallel=True, chunk=W, n_chunks=n, num_warps=num_warps or BLOCKED_WARPS,
            c_pad=c_pad, k_pad=k_pad, k_block=k_block, interval=interval, n_checkpoints=-(-T // interval), K=K_eff,
            idx64=idx64, bt=bt, rb=rb, cb=cb, linear=BLOCKED_LINEAR,
            linear_tile=BLOCK_OVERRIDE or LINEAR_TILE, marg=BLOCKED_MARGINALS,
            marg_tile=tuple(min(x, c_pad) if i == 2 else x for i, x in enumerate(MARG_OVERRIDE or MARG_TILE)),
            marg_warps=MARG_WARPS,
            beta_early=early,
            helpers=blocked_helpers(B, n, C, sms, early, on_cuda),
            repair_helpers=blocked_helpers(B, 1, C, sms, early, on_cuda) if REPAIR_HELPERS and n > 1 else 0,
            max_bounds=bool(MAX_BOUNDS) and semiring == "max", max_bound_phases=tuple(MAX_BOUND_PHASES))
    if time_parallel is None:
        # one program per sequence already fills the GPU at about two per multiprocessor
        parallel = supported and n >= 2 and B < 2 * sms
    else:
        if time_parallel and not supported:
            raise ValueError(
                f"time_parallel=True needs {limit} (here {k_pad} x {c_pad}); pass time_parallel=None"
            )
        parallel = bool(time_parallel) and n >= 2
    if parallel:
        kind, warps = ("dur" if duration_transitions else "reg"), par_warps
    return KernelPlan(
        kind=kind,
        time_parallel=parallel,
        chunk=W if parallel else max(T, 1),
        n_chunks=n if parallel else 1,
        num_warps=warps,
        c_pad=c_pad,
        k_pad=k_pad,
        k_block=k_block,
        interval=interval,
        n_checkpoints=-(-T // interval),
        K=K_eff,
        idx64=idx64,
    )


def masked_plan(B: int, T: int, K: int, C: int, *, semiring: str = "log", device=None,
                blocked: bool = False, duration_transitions: bool = False) -> Optional[KernelPlan]:
    """The plan of a constrained call (``label_mask`` / ``boundary_mask``): the time-parallel
    register-ring engine, whose kernels read the per-(position, label) segment limits, with a
    single chunk when the sequences are too short to cut. For a ring too large for registers:
    the blocked engine (``blocked.py``, which reads the same limits in its forward, beta and
    Viterbi) with ``blocked=True``, else None (the entropy and top-k kernels need the register
    ring); the caller then takes another path. A (K, C, C) transition (``duration_transitions``)
    runs the chunked direct recurrence (one chunk when the sequences are too short to cut), whose
    forward, beta, marginals and Viterbi read the same limits; None where K_PAD passes
    :data:`DUR_PARALLEL_MAX_K`."""
    import dataclasses

    try:
        p = make_plan(B, T, K, C, semiring=semiring, time_parallel=True, device=device,
                      duration_transitions=duration_transitions)
    except ValueError:
        return None
    if duration_transitions:
        return p if p.time_parallel else dataclasses.replace(p, kind="dur", time_parallel=True, chunk=max(T, 1),
                                                              n_chunks=1, num_warps=dur_parallel_warps(p.c_pad))
    if p.kind == "mem" and p.time_parallel:  # the blocked engine: a ring too large for registers
        return p if blocked else None
    if p.time_parallel:
        return p
    # one chunk on the register ring (the sequential kernels, "mem" at few warps included, take no masks)
    warps = ring_warps(p.k_pad, p.c_pad)
    return dataclasses.replace(p, kind="reg", time_parallel=True, chunk=max(T, 1), n_chunks=1, num_warps=warps)


# ---------------------------------------------------------------------------------------------
# Launch choices of the kernels around the recurrences (marginals, anchors, walks, entropy,
# sampling, k-best, segment limits): functions of the problem's sizes and the device, kept here
# beside the recurrences' plan so that every launch decision lives in this module.

#: Warps of the one-pass kernels that run one program per (sequence, chunk or anchor): the
#: per-position marginals (``marginals._shared_factored_kernel``), the anchors and the entropy's
#: marginals and anchors.
AUX_WARPS = 4

#: Warps of the walks (Viterbi traceback, sampling) and of the segment-limits kernel: a chain of
#: dependent loads a program, so more programs in flight instead of more warps.
WALK_WARPS = 1

#: Positions per program of the segment-limits kernel (``limits._limits_kernel``).
LIMITS_BLOCK = 256

#: Warps of the two entropy recurrences (None: :func:`entropy_warps`).
ENTROPY_WARPS: Optional[int] = None

#: Programs per multiprocessor that the entropy recurrences' chunks aim at (None: the plan's chunks).
ENTROPY_PROGRAMS_PER_SM: Optional[int] = None

#: Warps of the two entropy recurrences where their ring is too large for registers (the blocked
#: engine's plans, ``entropy._ent_chunks_kernel`` with ``MEM``): the ring is the stored rows, read
#: back in tiles of :func:`entropy_mem_rows` durations. 8: compiled for sm_90 at the gene grammar's
#: size (K_PAD 1024, C_PAD 64) every variant fits in 176-255 registers without spills, where 4 warps
#: spill 64-584 bytes (``benchmarks/probes/mem_entropy_registers.py``, GPU_NOTES 106; not timed).
ENTROPY_MEM_WARPS = 8

#: The fix-up length, in K, that the memory-ring entropy recurrences' chunk rule assumes
#: (:func:`entropy_mem_chunk`): fix-ups on ordinary models converge after ~1.2·K (the blocked
#: engine's, GPU_NOTES 35; the entropy recurrences' in the interpreter, GPU_NOTES 107).
ENTROPY_MEM_FIXUP = 1.2

#: The k-best kernels (``kbest.py``): elements of a (positions, labels, n) tile, from which the
#: positions per program follow, and the warps of the top-pick kernel; the in-edges kernel's
#: buffer and warps (one warp keeps the per-candidate reductions, the buffer's worst and "does any
#: node go on", inside a warp with no barrier, and leaves room for more programs in flight to hide
#: the dependent loads).
KBEST_BUFFER = 2048
KBEST_WARPS = 4
IN_EDGES_BUFFER = 256
IN_EDGES_WARPS = 1


def label_pad(C: int, least: int = 2) -> int:
    """The label axis of a kernel's tile: the next power of 2, at least ``least``."""
    return max(least, next_pow2(C))


def marginal_chunks(B: int, T: int, C: int, ws_per_chunk: int, min_programs: int = 2048, min_chunk: int = 32,
                    budget: int = 0):
    """``(chunk length, chunk count)`` of the per-position marginal kernels: enough programs to
    fill a GPU, and a per-chunk workspace (``ws_per_chunk`` floats per sequence and chunk) of at
    most twice the size of the (B, T, C) marginals, so that peak memory stays O(B·T·C) for any K
    (or of at most ``budget`` floats in all, where that allows more chunks)."""
    cap = max(2 * (T + 1) * C, budget // max(B, 1))
    n = max(1, min(-(-T // min_chunk), -(-min_programs // B), cap // ws_per_chunk))
    ch = -(-T // n)
    return ch, -(-T // ch)


#: Floats of workspace the (K, C, C) marginal kernel may take over the (B, T, C) bound of
#: :func:`marginal_chunks` (256 MB): its workspace is a (K, C, C) block a chunk (8.5 MB at K = 960,
#: C = 47), so that bound gave gene-grammar sizes one chunk a sequence (one program ran all of
#: (1, 20000, 500, 47)'s marginals: 45 s on an H200, GPU_NOTES 98).
DUR_MARGINAL_WORKSPACE = 1 << 26


def duration_marginal_chunks(B: int, T: int, K_eff: int, C: int):
    """``(chunk length, chunk count)`` of the (K, C, C) marginal kernel
    (``marginals._shared_duration_tr_kernel``): :func:`marginal_chunks` with a (K, C, C) workspace
    a chunk, allowed up to :data:`DUR_MARGINAL_WORKSPACE` floats in all where the (B, T, C) bound
    would give fewer chunks."""
    return marginal_chunks(B, T, C, K_eff * C * C, budget=DUR_MARGINAL_WORKSPACE)


def position_chunks(B: int, T: int, C: int):
    """``(chunk length, chunk count)`` of the per-position marginal kernel (P_end and the transition
    marginals) where the blocked engine's tiles (``marginals._blk_seg_kernel``) write P_start and the
    duration marginals: its workspace is then one (C, C) block a chunk, so it takes finer chunks than
    :func:`marginal_chunks` allows with the (K, C) duration block beside it (more programs, each
    running its positions one after another)."""
    return marginal_chunks(B, T, C, C * C)


#: Programs of the marginal tiles (``marginals._blk_seg_kernel``, 4 warps) an H100 / H200
#: multiprocessor runs at once: 255 registers a thread (the sm_90 compile report of
#: ``probes/blocked_registers.py KERNELS=_blk_seg_kernel``) is 32,640 of its 65,536 registers.
SEG_PROGRAMS_PER_SM = 2

#: Floats of (K, C) duration workspace the marginal tiles may take in all beyond the (B, T, C) bound
#: of :func:`marginal_chunks`, where more chunks fill the GPU's last wave (64 MiB).
SEG_WORKSPACE = 1 << 24


def seg_chunks(B: int, T: int, K_eff: int, C: int, groups: int, rows: int, device=None):
    """``(chunk length, chunk count)`` of the marginal tiles (``marginals._blk_seg_kernel``, its
    label tiles over ``groups`` programs a chunk, ``rows`` starts a tile): the backward's
    :func:`marginal_chunks` chunking, or more chunks where those finish sooner. A program's work
    grows with its chunk (each start sums its K durations), chunks of whole tiles cost what their
    padding costs, and the programs run in waves of ``SEG_PROGRAMS_PER_SM`` a multiprocessor, so
    the time goes as ``waves x chunk``: at (32, 3000, 960, 47) the shared 5 chunks of 600 are 480
    programs in 1.82 waves (2 x 600 in time), 8 chunks of 384 are 768 in 2.91 (3 x 384). Chunks of at least one tile, their (K, C)
    workspace within :data:`SEG_WORKSPACE` floats in all (or the B·T·C bound, if larger), at most
    about 8 waves of programs; the fewest chunks among equal times."""
    ch0, n0 = marginal_chunks(B, T, C, K_eff * C + C * C)  # the backward's shared chunking
    slots = max(1, _sms(device) * SEG_PROGRAMS_PER_SM)
    cap = max(2 * (T + 1) * C, SEG_WORKSPACE // max(B, 1)) // max(K_eff * C, 1)

    def cost(ch):
        n = -(-T // ch)
        return -(-B * n * groups // slots) * ch, n

    best, best_ch = cost(ch0), ch0
    # past ~8 waves a part-filled last one costs little: search up to that many programs
    most = min(cap, -(-T // rows), max(n0, -(-8 * slots // max(B * groups, 1))))
    for n in range(n0 + 1, most + 1):
        ch = -(-T // n)
        ch = -(-ch // rows) * rows  # rounded up to whole tiles
        c = cost(ch)
        if c < best:
            best, best_ch = c, ch
    return best_ch, -(-T // best_ch)


#: Label groups of the marginal tiles' programs (:func:`seg_label_groups`); None: one a label tile.
SEG_GROUPS_OVERRIDE: Optional[int] = None


def seg_label_groups(C: int, cb: int) -> int:
    """Programs a chunk of the marginal tiles (``marginals._blk_seg_kernel``) spreads its label
    tiles over: one a tile of ``cb`` labels. Their workspace is the chunk's (K, C) duration block,
    which bounds the chunks (:func:`marginal_chunks`); label tiles write columns of it that no
    other tile writes, so splitting them adds programs, not memory."""
    return SEG_GROUPS_OVERRIDE or -(-C // cb)


def anchor_splits(B: int, n_anchor: int, device) -> int:
    """Programs over which each of the blocked engine's anchors (O(K²·C) each) splits its
    starts: about two programs per multiprocessor in all, at most 16 an anchor."""
    return max(1, min(16, next_pow2(-(-2 * _sms(device) // (B * n_anchor)))))


def walk_blocks(K: int, T: int):
    """``(K_BLOCK, FILL)`` of a walk over rows of ``T`` positions (the traceback and sampling
    kernels): the durations read per load, and the block that fills a walk's labels."""
    return max(2, min(128, next_pow2(K))), min(1024, max(32, next_pow2(T)))


def entropy_warps(plan: KernelPlan) -> int:
    """Warps of the two entropy recurrences: the fewest whose register budget
    (:data:`REG_RING_ELEMENTS`) holds the (K_PAD, C_PAD) ring, from 2 (the log Z kernels start
    from 4). Their steps do about twice the forward's work per ring entry, and fewer warps halve
    the cross-warp reductions; below the budget (a ring of 4096 entries on 2 warps) the registers
    spill. On an H200 this took the recurrences' share of an entropy with its gradient at
    (1, 1e6, 64, 24) from 51.5 to 45.4 ms (benchmarks/GPU_NOTES.md, entry 27)."""
    return ENTROPY_WARPS if ENTROPY_WARPS is not None else ring_warps(plan.k_pad, plan.c_pad, fewest=2)


def entropy_mem_rows(c_pad: int) -> int:
    """Durations per tile of the memory-ring entropy recurrences: a (rows, C_PAD) tile of about
    2048 elements, 8 to 64 rows (:data:`K_BLOCK_OVERRIDE` where set, as for the duration tiles of
    the marginal kernels)."""
    if K_BLOCK_OVERRIDE is not None:
        return K_BLOCK_OVERRIDE
    return max(8, min(64, 2048 // c_pad))


def entropy_chunk(B: int, T: int, K_eff: int, plan: KernelPlan, device) -> int:
    """Chunk length of the two entropy recurrences: the plan's (a blocked plan's by
    :func:`entropy_mem_chunk`), or about :data:`ENTROPY_PROGRAMS_PER_SM` programs per
    multiprocessor, each at least 2·K long."""
    if CHUNK_OVERRIDE is not None:
        return plan.chunk
    if ENTROPY_PROGRAMS_PER_SM is None:
        return entropy_mem_chunk(B, T, K_eff, device) if plan.kind == "mem" else plan.chunk
    want = max(1, -(-ENTROPY_PROGRAMS_PER_SM * _sms(device) // max(B, 1)))
    return max(2 * K_eff, 64, -(-T // want))


def entropy_mem_chunk(B: int, T: int, K_eff: int, device) -> int:
    """Chunk length of the memory-ring entropy recurrences (``MEM``: one 8-warp program per
    multiprocessor): of the n chunks a sequence (each at least 1.5·K long unless n = 1), the one that
    minimises the predicted steps of the speculative and fix-up launches,
    ``waves(2·B·n)·W + waves(2·B·(n-1))·min(W, F)``, W = ceil(T / n), F =
    :data:`ENTROPY_MEM_FIXUP`·K, with the prefix and suffix recurrences side by side (2·B·n
    programs a launch) and ``waves(p) = ceil(p / SMs)``. A chunk pays ~F fix-up steps, and a launch
    of more programs than multiprocessors runs in waves, so where the blocked plan's chunks (sized
    for the blocked engine's cheaper steps) would take two waves, fewer and longer chunks that fit
    in one win: on 132 multiprocessors (32, 3000, 960) takes 2 chunks of 1,500 instead of 3 of 1,440,
    (16, 20000, 960) 4 of 5,000 instead of 8 of 2,500. Ties go to fewer chunks.

    >>> entropy_mem_chunk(32, 3000, 960, None), entropy_mem_chunk(16, 20000, 960, None)
    (1500, 5000)
    """
    return _entropy_mem_chunk(B, T, K_eff, _sms(device), ENTROPY_MEM_FIXUP)


@functools.lru_cache(maxsize=256)
def _entropy_mem_chunk(B: int, T: int, K_eff: int, sms: int, fixup: float) -> int:
    fix = math.ceil(fixup * K_eff)
    least = math.ceil(1.5 * K_eff)
    best = None
    for n in range(1, max(1, 4 * -(-sms // max(2 * B, 1))) + 1):
        W = -(-T // n)
        if n > 1 and W < least:
            break
        steps = -(-2 * B * n // sms) * W + -(-2 * B * (n - 1) // sms) * min(W, fix)
        if best is None or steps < best[0]:
            best = (steps, W)
    return max(best[1], 1)


def sample_chunk_length(rows: int, T: int, K: int, device) -> int:
    """Chunk length of the sampling walk on ``device``: about 32 one-warp programs per
    multiprocessor (a walk is a chain of dependent loads, so more programs in flight hide the
    latency), each chunk at least K (a segment crosses at most one boundary) and 64 long."""
    if CHUNK_OVERRIDE is not None:
        return max(int(CHUNK_OVERRIDE), K, 1)
    want = max(1, -(-32 * _sms(device) // max(rows, 1)))
    return max(K, 64, -(-T // want))


def kbest_rows(C_PAD: int, N_PAD: int, budget: int = KBEST_BUFFER) -> int:
    """Positions per program of a k-best kernel whose tile holds ``budget`` elements."""
    return max(1, min(64, budget // (C_PAD * N_PAD)))


#: Warps of the dense model's recurrences (``dense.py``: one program per sequence).
DENSE_WARPS = 4


def dense_tiles(K: int, C: int, factored: bool):
    """``(C_PAD, C1_PAD, K_BLK)`` of the dense model's recurrences (``dense.py``): the label axes
    (C, and C + 1 with the first segment's phantom predecessor) and the durations a tile forms
    at once, ~2048 edge terms for a (C, C) transition (factored) and ~4096 for (K, C+1, C) edges."""
    c_pad, c1_pad = next_pow2(C), next_pow2(C + 1)
    budget = 2048 // c_pad if factored else 4096 // (c1_pad * c_pad)
    return c_pad, c1_pad, max(1, min(next_pow2(K), budget))


def table_tiles(K: int, c_pad: int):
    """``(CB, KB, warps)`` of the duration tables' one kernel (``tables.py``): 32 labels and 32
    rows of ED a program (64 programs at K = 960, C = 47), each with eight (32, 32) running
    statistics over the durations, 32 a step, over 4 warps."""
    return min(32, next_pow2(c_pad)), max(1, min(32, next_pow2(K))), 4

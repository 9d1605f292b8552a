"""k-best segmentations on the engine: Eppstein's sidetracks over the Viterbi forward tree.

The max-semiring forward of the engine (time-parallel) gives every node's best score
``alpha(t, c)`` (the best prefix whose last segment has label c and ends at t) and its backpointer,
the best in-edge. Every other in-edge ``e = (s, c') -> (t, c)`` is a *sidetrack* with deficit
``delta(e) = alpha(t, c) - (alpha(s, c') + w(e)) >= 0``. A segmentation is determined by its
sidetracks read from the end: follow backpointers from the sink until the head of the first
sidetrack, take it to its tail, follow backpointers from there, and so on; its score is the best
score minus the sum of its deficits (Eppstein 1998, with the tree of best prefixes). So with, for
a node x, ``H(x)`` = the sidetracks into the nodes of x's backpointer path sorted by deficit, the
k best segmentations come out of a best-first search over sidetrack sequences in which each
sequence has two children: its last sidetrack replaced by the next one of the same list, or one
more sidetrack, the first of ``H(tail)``. Both have a cost no smaller than their parent's, and
every sequence has exactly one parent, so the search returns the segmentations in order of score,
each once.

What it costs: one forward, the k best in-edges of every node (parallel over positions: no
recurrence), and one backpointer walk per extracted segmentation (the chunked traceback walk,
from the tail of its last sidetrack). The scores are recomputed exactly (float64) from the
segments at the end.

Only for a (C, C) transition without masks (the PyTorch path of
:func:`~torch_semimarkov.semi_crf_streaming_topk` does the rest).
"""

from __future__ import annotations

import heapq
from typing import Dict, List, Optional, Tuple

import torch

from torch_semimarkov.core.validation import StreamingInputs

#: A deficit at least this large marks an edge that does not exist (an impossible score).
_NO_EDGE = 1e25

#: Select the in-edges with the Triton kernels (``kbest.py``); False: the PyTorch blocks of
#: :func:`_best_in_edges` (the kernels' reference).
SELECTION_KERNEL = True


def _alpha(saved, frames, lengths):
    """float64 alpha (B, T+1, C) from the forward's rows; -inf past each length and where impossible."""
    alpha = frames[..., None] + saved[0].double()
    T1 = alpha.shape[1]
    past = torch.arange(T1, device=alpha.device)[None, :] > lengths[:, None]
    alpha = alpha.masked_fill(past[..., None], -float("inf"))
    return torch.where(alpha < -_NO_EDGE, torch.full_like(alpha, -float("inf")), alpha)


def _best_in_edges(inp: StreamingInputs, alpha, bp, k: int, use_kernel: Optional[bool] = None):
    """The k smallest-deficit in-edges of every node other than its backpointer edge.

    Returns ``(delta (B, T+1, C, k) float64, dur (B, T+1, C, k) int64, prev (B, T+1, C, k) int64)``:
    an in-edge of node (t, c) is the segment ``[t - dur, t)`` of label c after a segment of label
    ``prev`` (C: the sequence starts there); ``delta`` is +inf where fewer edges exist.
    ``use_kernel``: the selection by ``kbest.py`` (tested under the interpreter against
    these PyTorch blocks); None (default): the kernel when :data:`SELECTION_KERNEL`."""
    B, T1, C = alpha.shape
    T, K = T1 - 1, inp.K
    dev = alpha.device
    tr = inp.transition.double().masked_fill(inp.transition.double() <= -_NO_EDGE, -float("inf"))
    D = inp.duration_bias.double().masked_fill(inp.duration_bias.double() <= -_NO_EDGE, -float("inf"))
    S = inp.cum_scores.double()
    ps = None if inp.proj_start is None else inp.proj_start.double()
    pe = None if inp.proj_end is None else inp.proj_end.double()
    if use_kernel is None:
        from torch_semimarkov.engines.triton.common import HAS_TRITON
        use_kernel = SELECTION_KERNEL and HAS_TRITON  # (the engine's forward ran: Triton is there)
    if use_kernel:
        from torch_semimarkov.engines.triton.kbest import in_edges
        return in_edges(alpha, S, ps, pe, tr, D, bp, inp.lengths, K, k)
    kk = k + 1  # one more per start position: the backpointer edge may be among them
    # V[s, j, c]: the j-th best alpha(s, c') + Tr[c', c] over c' (s >= 1; a stable sort: ties by
    # c', as the kernel), with its c'; s = 0: the first segment's single edge, logsumexp_{c'} Tr[c', c]
    n_top = min(kk, C)
    V = torch.full((B, T1, kk, C), -float("inf"), dtype=torch.float64, device=dev)
    Vc = torch.zeros((B, T1, kk, C), dtype=torch.int64, device=dev)
    step = max(1, 2**24 // max(1, B * C * C))
    for s0 in range(0, T1, step):
        x = alpha[:, s0:s0 + step, :, None] + tr[None, None]  # (B, n, C', C)
        v, i = torch.sort(x, dim=2, descending=True, stable=True)
        V[:, s0:s0 + step, :n_top], Vc[:, s0:s0 + step, :n_top] = v[:, :, :n_top], i[:, :, :n_top]
    V[:, 0] = -float("inf")
    V[:, 0, 0] = torch.logsumexp(tr, 0)
    Vc[:, 0] = C
    delta = torch.full((B, T1, C, k), float("inf"), dtype=torch.float64, device=dev)
    dur = torch.zeros((B, T1, C, k), dtype=torch.int64, device=dev)
    prev = torch.zeros((B, T1, C, k), dtype=torch.int64, device=dev)
    bk = (bp >> 16).long()
    bc = (bp & 65535).long()
    ks = torch.arange(1, K + 1, device=dev)
    block = max(1, 2**24 // max(1, B * K * kk * C))
    for t0 in range(1, T1, block):
        t = torch.arange(t0, min(T1, t0 + block), device=dev)
        s = t[:, None] - ks[None, :]  # (n, K)
        valid = s >= 0
        sc = s.clamp(min=0)
        cand = V[:, sc] + D[None, None, :, None, :]  # (B, n, K, kk, C)
        seg = S[:, t][:, :, None, :] - S[:, sc]  # (B, n, K, C)
        if ps is not None:
            seg = seg + ps[:, sc.clamp(max=T - 1)]
        if pe is not None:
            seg = seg + pe[:, (t - 1)][:, :, None, :]
        cand = cand + seg[:, :, :, None, :]
        cand = cand.masked_fill(~valid[None, :, :, None, None], -float("inf"))
        c_of = Vc[:, sc]  # (B, n, K, kk, C)
        # the backpointer edge: duration bk, predecessor bc (any predecessor when it starts at 0)
        is_bp = (ks[None, None, :, None, None] == bk[:, t][:, :, None, None, :]) & (
            (c_of == bc[:, t][:, :, None, None, :]) | (sc[None, :, :, None, None] == 0))
        # exactly one candidate is the backpointer edge: the first that matches
        first = is_bp & (torch.cumsum(is_bp.reshape(B, len(t), K * kk, C).long(), 2).reshape(is_bp.shape) == 1)
        cand = cand.masked_fill(first, -float("inf"))
        d = alpha[:, t][:, :, None, None, :] - cand  # (B, n, K, kk, C)
        d = d.masked_fill(~torch.isfinite(d) | (d > _NO_EDGE), float("inf"))
        flat = d.permute(0, 1, 4, 2, 3).reshape(B, len(t), C, K * kk)
        # a stable sort: equal deficits by index (duration, then predecessor rank), as the kernel
        vals, idx = (x[..., :min(k, K * kk)] for x in torch.sort(flat, dim=3, stable=True))
        n_k = vals.shape[3]
        delta[:, t, :, :n_k] = vals
        dk = idx // kk
        dur[:, t, :, :n_k] = dk + 1
        cj = idx % kk
        cof = c_of.permute(0, 1, 4, 2, 3).reshape(B, len(t), C, K * kk)
        prev[:, t, :, :n_k] = cof.gather(3, dk * kk + cj)
    return delta, dur, prev


def _path_lists(delta, dur, prev, seq, labels, starts, t0, k: int):
    """For each walk row (sequence ``seq``, walk from ``t0`` with its labels / starts): the k
    smallest deficits among the sidetracks into the nodes of its path, and the sidetracks."""
    R, T = labels.shape
    dev = labels.device
    pos = torch.arange(1, T + 1, device=dev)
    # the nodes of the path: (e, label of position e - 1) for every segment end e <= t0
    end = torch.zeros((R, T), dtype=torch.bool, device=dev)
    end[:, :-1] = starts[:, 1:]
    end |= pos[None, :] == t0[:, None]
    end &= pos[None, :] <= t0[:, None]
    lab = labels.clamp(min=0)
    d = delta[seq[:, None], pos[None, :], lab]  # (R, T, k)
    d = d.masked_fill(~end[..., None], float("inf"))
    vals, idx = torch.topk(d.reshape(R, T * k), min(k, T * k), dim=1, largest=False)
    e = idx // k + 1
    j = idx % k
    c = lab.gather(1, e - 1)
    kd = dur[seq[:, None], e, c, j]
    cp = prev[seq[:, None], e, c, j]
    return vals, e, c, kd, cp


def topk_on_engine(inp: StreamingInputs, k: int):
    """``(labels (B, k, T), starts (B, k, T))`` of the k best segmentations on the engine, best
    first by float32 deficits (-1 / False for ranks that do not exist), or None where it cannot
    run (then the PyTorch path). The caller scores them exactly."""
    from torch_semimarkov.engines.triton import launch, parallel
    from torch_semimarkov.engines.triton.plan import masked_plan

    B, T, K, C = inp.batch, inp.T, inp.K, inp.C
    dev = inp.cum_scores.device
    plan = masked_plan(B, T, K, C, semiring="max", device=dev)
    if plan is None:
        return None
    d = lambda x: None if x is None else x.detach()  # noqa: E731
    with torch.no_grad():
        cum, tr, db, lengths, ps, pe = launch._prepare(d(inp.cum_scores), d(inp.transition), d(inp.duration_bias),
                                                       inp.lengths, d(inp.proj_start), d(inp.proj_end))
        saved, frames, bp, _ = parallel.forward_chunked(cum, tr, db, lengths, "max", ps, pe, plan)
        alpha = _alpha(saved, frames, lengths)
        rows = torch.arange(B, device=dev)
        final = alpha[rows, lengths]  # (B, C)
        # the final label of the engine's Viterbi (its traceback's choice: the first maximum)
        c_star = saved[0][rows, lengths].argmax(-1)
        best = final.gather(1, c_star[:, None])[:, 0]
        ok = torch.isfinite(best)
        delta, dur, prev = _best_in_edges(inp, alpha, bp, k)
        # the sink's sidetracks: the other final labels
        sink_d = (best[:, None] - final).masked_fill(c_star[:, None] == torch.arange(C, device=dev)[None, :],
                                                     float("inf"))
        sink_d = sink_d.masked_fill(~torch.isfinite(sink_d), float("inf"))
        # every walked node: its row among the walks' labels / starts, and its H list
        walks: Dict[Tuple[int, int, int], Tuple[int, list]] = {}
        walk_labels: List[torch.Tensor] = []
        walk_starts: List[torch.Tensor] = []

        def walk(nodes: List[Tuple[int, int, int]]):
            """Walk from each (b, t, c) not walked yet; store its row and H list."""
            nodes = [n for n in dict.fromkeys(nodes) if n not in walks]
            if not nodes:
                return
            nb = torch.tensor(nodes, device=dev, dtype=torch.int64)
            seq, t0, c0 = nb[:, 0], nb[:, 1], nb[:, 2]
            lab, st = parallel.traceback_from(bp, saved[0], seq, t0, c0, plan)
            vals, e, c, kd, cp = (x.tolist() for x in _path_lists(delta, dur, prev, seq, lab, st, t0, k))
            first = sum(x.shape[0] for x in walk_labels)
            walk_labels.append(lab)
            walk_starts.append(st)
            for r, n in enumerate(nodes):
                h = [(v, (e[r][i], c[r][i], kd[r][i], cp[r][i])) for i, v in enumerate(vals[r]) if v < _NO_EDGE]
                walks[n] = (first + r, h)

        L = lengths.tolist()
        cs = c_star.tolist()
        feasible = ok.tolist()
        walk([(b, L[b], cs[b]) for b in range(B) if feasible[b]])
        sink = {}
        for b in range(B):
            if not feasible[b]:
                continue
            own = [(v, (L[b], c, 0, c)) for c, v in enumerate(sink_d[b].tolist()) if v < _NO_EDGE]
            sink[b] = sorted(own + walks[(b, L[b], cs[b])][1], key=lambda x: x[0])[:k]
        # best-first search over sidetrack sequences. A sidetrack (head t, head c, duration, prev):
        # the segment [t - duration, t) of label c after prev, tail node (t - duration, prev) (prev
        # C: the sequence starts there); the sink's own sidetracks are (L, c, 0, c). A path: a list
        # of (owner, index): owner None is the sink's list, else the tail node whose list it is.
        found: List[List[list]] = [[[]] if feasible[b] else [] for b in range(B)]
        heaps: List[list] = [[] for _ in range(B)]
        order = [0]

        def h_list(b, owner):
            return sink[b] if owner is None else walks[(b,) + owner][1]

        def push(b, cost, path):
            heapq.heappush(heaps[b], (cost, order[0], path))
            order[0] += 1

        for b in sink:
            if sink[b]:
                push(b, sink[b][0][0], [(None, 0)])
        for rank in range(1, k):
            popped = []
            for b in range(B):
                if heaps[b]:
                    cost, _, path = heapq.heappop(heaps[b])
                    found[b].append(path)
                    owner, j = path[-1]
                    lst = h_list(b, owner)
                    if j + 1 < len(lst):
                        push(b, cost - lst[j][0] + lst[j + 1][0], path[:-1] + [(owner, j + 1)])
                    t, _, kd, cp = lst[j][1]
                    if cp < C:
                        popped.append((b, cost, path, (t - kd, cp)))
            # one batch of walks from the new tails (the segmentations' first segments; and the
            # lists the next sidetrack may come from)
            walk([(b,) + tail for b, _, _, tail in popped])
            for b, cost, path, tail in popped:
                lst = walks[(b,) + tail][1]
                if lst and rank < k - 1:
                    push(b, cost + lst[0][0], path + [(tail, 0)])
        return _assemble(found, h_list, walks, walk_labels, walk_starts, L, cs, B, k, T, C)


def _assemble(found, h_list, walks, walk_labels, walk_starts, L, cs, B: int, k: int, T: int, C: int):
    """The segmentations ``(labels (B, k, T), starts (B, k, T))`` from the sidetrack sequences.

    Each is a few pieces: stretches copied from a walk (from the head of a sidetrack back to the
    tail of the previous one, and from the last tail to position 0) and the sidetracks' own
    segments. The pieces are listed on the host (a few per segmentation) and drawn on the GPU at
    once: every position finds its piece by a binary search among the pieces' first positions,
    then one gather."""
    dev = walk_labels[0].device if walk_labels else torch.device("cpu")
    rows, los, kinds, vals = [], [], [], []  # kind 0: a walk's row; 1: a segment of label val; 2: none
    for b in range(B):
        for r, path in enumerate(found[b]):
            node, hi = (L[b], cs[b]), L[b]
            pieces = [(L[b], 2, 0)]  # past the length: nothing
            for owner, j in path:
                t, c, kd, cp = h_list(b, owner)[j][1]
                if t < hi:
                    pieces.append((t, 0, walks[(b,) + node][0]))
                if kd:
                    pieces.append((t - kd, 1, c))
                node, hi = (t - kd, cp), t - kd
            if node[1] < C and hi > 0:
                pieces.append((0, 0, walks[(b,) + node][0]))
            for lo, kind, val in sorted(pieces):
                rows.append(b * k + r)
                los.append(lo)
                kinds.append(kind)
                vals.append(val)
    labels = torch.full((B * k, T), -1, dtype=torch.int64, device=dev)
    starts = torch.zeros((B * k, T), dtype=torch.bool, device=dev)
    if not rows:
        return labels.view(B, k, T), starts.view(B, k, T)
    # piece 0: none (rows without a segmentation)
    lo_t, kind_t, val_t = (torch.tensor(x, dtype=torch.int64).to(dev) for x in ([0] + los, [2] + kinds, [0] + vals))
    # the piece of (row, position): the number of pieces at or before it in row-major order (keys
    # ascend: rows in order, pieces by first position; a row's last piece, past its length, is
    # "none", and so is piece 0 before the first row's first piece)
    keys = torch.tensor(rows, dtype=torch.int64).to(dev) * (T + 1) + lo_t[1:]
    pos = torch.arange(T, device=dev)[None, :]
    query = torch.arange(B * k, device=dev)[:, None] * (T + 1) + pos
    pid = torch.searchsorted(keys, query, right=True)
    kind, val = kind_t[pid], val_t[pid]
    is_walk = kind == 0
    row = torch.where(is_walk, val, 0)
    walk_lab = torch.cat(walk_labels)
    walk_st = torch.cat(walk_starts)
    labels = torch.where(is_walk, walk_lab[row, pos], torch.where(kind == 1, val, labels))
    starts = torch.where(is_walk, walk_st[row, pos], (kind == 1) & (pos == lo_t[pid]))
    return labels.view(B, k, T), starts.view(B, k, T)

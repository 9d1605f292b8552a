"""Gene finders over DNA: a dilated-CNN encoder with a semi-CRF gene-structure head, and two baselines.

* :class:`GeneStructureHead` is a :class:`~torch_semimarkov.nn.SemiMarkovCRFHead` over the labels
  of :class:`~torch_semimarkov.genomics.labels.GeneGrammar` with

  - the grammar's allowed transitions and a duration mask that keeps every exon's length
    consistent with its phases (``-inf`` duration bias elsewhere), under a smooth learned duration
    score (Gaussian bumps on log k per label, :class:`PhaseDuration`);
  - boundary scores (``proj_start`` / ``proj_end``) for splice sites and start / stop codons;
  - a reading-frame content score: the encoder scores each position as codon position 0, 1 or 2 of
    a coding region on each strand (relative scores: they sum to zero over the three); an exon
    segment adds up the scores of the frame its phases imply. Cumulative sums per frame make this a pair of boundary terms (a start term ``-G[s]`` and
    an end term ``+G[e+1]`` of the frame picked by the label's phase and the position mod 3), so
    the engine's cost does not change. In-frame stop codons get a learned penalty (never inside a
    codon that runs past the exon's 3' end).

* :class:`SemiCRFGeneFinder`: encoder + that head; :class:`CodonCRFTagger`: the same encoder with a
  linear-chain CRF (a semi-CRF head with K = 1) over :class:`~torch_semimarkov.genomics.labels.CodonLabels`;
  :class:`CodonSoftmaxTagger`: the same encoder with a per-position softmax over those labels. Both
  CRF models add the softmax's cross-entropy on their encoder features as an auxiliary loss
  (``aux_weight``, default 0.5), which trains the encoder faster; prediction does not use it.

All three take batches ``{"codes": (B, T) long, "lengths": (B,)}`` (plus ``"segments"`` or
``"labels"`` for the loss) and return genes per sequence from :meth:`predict_genes`.

Example:
    >>> _ = torch.manual_seed(0)
    >>> from torch_semimarkov.genomics.records import encode_dna
    >>> model = SemiCRFGeneFinder(max_duration=12, hidden=16)
    >>> codes = torch.as_tensor(encode_dna("ATGAAACCCGGGTTTTAA" * 3)).long()[None]
    >>> genes = model.predict_genes(codes, torch.tensor([54]))
    >>> isinstance(genes[0], list)
    True
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from torch_semimarkov.nn import SemiCRFOutput, SemiMarkovCRFHead
from torch_semimarkov.genomics.labels import CodonLabels, GeneGrammar
from torch_semimarkov.genomics.records import SIGNALS, Gene, one_hot, signal_violations, stop_codon_tracks

__all__ = [
    "DNAEncoder",
    "PhaseDuration",
    "GeneStructureHead",
    "TiedLinear",
    "SemiCRFGeneFinder",
    "CodonCRFTagger",
    "CodonSoftmaxTagger",
    "build_model",
    "MODEL_KINDS",
]

MODEL_KINDS = ("semicrf", "crf", "softmax")
#: DNA tracks the gene-structure head reads after the encoder's features: 2 stop-codon tracks, 8 signals
NUM_TRACKS = 2 + len(SIGNALS)


class DNAEncoder(nn.Module):
    """Residual dilated 1-D CNN over DNA: codes (B, T) -> features (B, T, H).

    Input channels: the one-hot bases (unknown bases are all zero) and the two stop-codon tracks of
    :func:`~torch_semimarkov.genomics.records.stop_codon_tracks`. Each block is
    LayerNorm -> dilated conv -> GELU -> 1x1 conv, added to its input. The receptive field is
    ``stem - 1 + (kernel_size - 1) * sum(dilations) + 1`` bases (519 by default).
    """

    def __init__(self, hidden: int = 64, kernel_size: int = 5, stem: int = 11,
                 dilations: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), dropout: float = 0.1):
        super().__init__()
        self.hidden = hidden
        self.stem = nn.Conv1d(6, hidden, stem, padding=stem // 2)
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in dilations)
        self.convs = nn.ModuleList(
            nn.Conv1d(hidden, hidden, kernel_size, padding=d * (kernel_size - 1) // 2, dilation=d) for d in dilations
        )
        self.mixes = nn.ModuleList(nn.Conv1d(hidden, hidden, 1) for _ in dilations)
        self.dropout = nn.Dropout(dropout)
        self.out_norm = nn.LayerNorm(hidden)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        x = torch.cat([one_hot(codes), stop_codon_tracks(codes)], dim=-1)
        # shape: (B, H, T) -- channels first for the convolutions
        h = self.stem(x.transpose(1, 2))
        for norm, conv, mix in zip(self.norms, self.convs, self.mixes):
            z = norm(h.transpose(1, 2)).transpose(1, 2)
            h = h + self.dropout(mix(F.gelu(conv(z))))
        return self.out_norm(h.transpose(1, 2))


class PhaseDuration(nn.Module):
    """A smooth learned duration score per label, with a mask of forbidden durations.

    ``score[k-1, c] = sum_m w[m, c] exp(-(log k - mu_m)^2 / (2 sigma^2))`` on ``num_basis`` centres
    ``mu_m`` spread evenly over ``[0, log K]``; ``-inf`` where ``mask`` is False. Use it as the
    head's ``duration=`` callable.
    """

    def __init__(self, mask: torch.Tensor, num_basis: int = 16):
        super().__init__()
        K, C = mask.shape
        centres = torch.linspace(0.0, math.log(K), num_basis)
        self.register_buffer("centres", centres, persistent=False)
        self.width = float(centres[1] - centres[0]) if num_basis > 1 else 1.0
        self.weight = nn.Parameter(torch.zeros(num_basis, C))
        self.register_buffer("mask", mask.bool().clone())

    def forward(self, durations: torch.Tensor) -> torch.Tensor:
        # shape: (K, M) -- the basis functions at log k
        dtype = durations.dtype
        phi = torch.exp(-0.5 * ((torch.log(durations) - self.centres.to(dtype)[None, :]) / self.width) ** 2)
        return (phi @ self.weight.to(dtype)).masked_fill(~self.mask, float("-inf"))


class TiedLinear(nn.Module):
    """``Linear(in_dim, C)`` whose outputs share a group term: ``score[c] = shared[group[c]] + own[c]``.

    ``own`` starts at zero, so labels of a group (e.g. the 16 exon labels of a strand) start with
    one score and learn their differences only where the data demand them.
    """

    def __init__(self, in_dim: int, groups: Sequence[int]):
        super().__init__()
        groups = torch.as_tensor(groups, dtype=torch.long)
        self.register_buffer("groups", groups, persistent=False)
        self.shared = nn.Linear(in_dim, int(groups.max()) + 1)
        self.own = nn.Linear(in_dim, len(groups))
        nn.init.zeros_(self.own.weight)
        nn.init.zeros_(self.own.bias)

    @property
    def weight(self) -> torch.Tensor:  # the head reads .weight for its dtype
        return self.own.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(x)[..., self.groups] + self.own(x)


def _inv_softplus(x: float) -> float:
    return x + math.log(-math.expm1(-x))


class GeneStructureHead(SemiMarkovCRFHead):
    """A semi-CRF head for :class:`GeneGrammar` with a reading-frame content score (module docstring).

    ``hidden_states`` are (B, T, H + 10): the encoder's H features followed by the two stop-codon
    tracks (+ strand, - strand) and the eight signal tracks of
    :func:`~torch_semimarkov.genomics.records.signal_violations` of the same positions
    (:meth:`SemiCRFGeneFinder.head_inputs` builds them).

    Args:
        max_duration: K; exons longer than K are continuation pieces (see :class:`GeneGrammar`).
        hidden_dim: H, the encoder's feature size (without the two stop tracks).
        grammar: the label set (default :class:`GeneGrammar`).
        num_basis: basis functions of the duration score.
        stop_penalty: initial penalty (nats) of an in-frame stop codon inside an exon (learned).
        signal_penalty: fixed penalty (nats) of an exon boundary without its consensus signal
            (start codon ATG, donor GT/GC, acceptor AG, a stop codon after the CDS).
        **kwargs: passed on to :class:`SemiMarkovCRFHead` (``use_triton``, ``cumsum_dtype``...).
    """

    def __init__(self, max_duration: int, hidden_dim: int, grammar: Optional[GeneGrammar] = None,
                 num_basis: int = 16, stop_penalty: float = 8.0, signal_penalty: float = 20.0, **kwargs):
        grammar = grammar or GeneGrammar()
        K, C = int(max_duration), grammar.num_labels
        super().__init__(
            C, K, hidden_dim=hidden_dim + NUM_TRACKS,
            duration=PhaseDuration(grammar.duration_mask(K), num_basis),
            allowed_transitions=grammar.allowed_transitions(),
            boundary_scores=True,
            **kwargs,
        )
        self.grammar = grammar
        self.feature_dim = int(hidden_dim)
        # codon position scores: channels 0-2 the + strand, 3-5 the - strand
        self.frame_proj = nn.Linear(hidden_dim, 6)
        self.raw_stop_penalty = nn.Parameter(torch.full((2,), _inv_softplus(stop_penalty)))
        for name, table in grammar.frame_tables().items():
            self.register_buffer(f"frame_{name}", table, persistent=False)
        for name, table in grammar.signal_tables().items():
            self.register_buffer(f"signal_{name}", table, persistent=False)
        self.signal_penalty = float(signal_penalty)
        # labels that mean the same to the emission or to a boundary share most of their scores
        in_dim = hidden_dim + NUM_TRACKS
        self.projection = TiedLinear(in_dim, grammar.emission_groups())
        self.proj_start = TiedLinear(in_dim, grammar.boundary_groups("start"))
        self.proj_end = TiedLinear(in_dim, grammar.boundary_groups("end"))

    def crf_parameters(self) -> List[torch.Tensor]:
        return super().crf_parameters() + [self.raw_stop_penalty]

    def build(self, hidden_states: torch.Tensor, lengths=None, *, mask=None) -> SemiCRFOutput:
        out = super().build(hidden_states, lengths, mask=mask)
        B, T, _ = hidden_states.shape
        dtype = out.cum_scores.dtype
        dev = hidden_states.device
        feats = hidden_states[..., : self.feature_dim]
        if not torch.is_autocast_enabled(dev.type) and feats.dtype != self.frame_proj.weight.dtype:
            feats = feats.to(self.frame_proj.weight.dtype)
        q = self.frame_proj(feats)
        with torch.autocast(device_type=dev.type, enabled=False):
            q = q.to(dtype)
            H = self.feature_dim
            stops = hidden_states[..., H:H + 2].to(dtype)
            viol = hidden_states[..., H + 2:H + NUM_TRACKS].to(dtype)
            pen = F.softplus(self.raw_stop_penalty).to(dtype)
            # only what tells the three codon positions apart: the frame-independent part of the
            # coding evidence is the coding labels' own emission, and a per-position zero sum keeps
            # the cumulative frame scores small without centring over the sequence (which would turn
            # the stop penalty's mean into a reward for every stop-free base)
            q = q.view(B, T, 2, 3)
            q = (q - q.mean(-1, keepdim=True)).view(B, T, 6)
            q = q - torch.cat([(pen[0] * stops[..., 0])[..., None], q.new_zeros(B, T, 2),
                               (pen[1] * stops[..., 1])[..., None], q.new_zeros(B, T, 2)], dim=-1)
            t = torch.arange(T, device=dev)
            r = torch.arange(3, device=dev)
            # F_r(t): the score of position t when codon position 0 sits at positions = r (mod 3);
            # on the - strand the codon positions run right to left
            idx = torch.cat([(t[:, None] - r[None, :]) % 3, 3 + (r[None, :] - t[:, None]) % 3], dim=1)
            frame = q.gather(2, idx[None].expand(B, T, 6))
            valid = (t[None, :] < out.lengths[:, None])[..., None]
            zero = frame.new_zeros(())
            frame = torch.where(valid, frame, zero)
            # shape: (B, T+1, 7) -- cumulative frame scores and a zero channel for non-coding labels
            G = torch.cat([frame.new_zeros(B, 1, 6), frame.cumsum(1)], dim=1)
            G = torch.cat([G, G.new_zeros(B, T + 1, 1)], dim=2)
            coding = self.frame_strand >= 0
            base = 3 * self.frame_strand.clamp(min=0)
            idx_s = torch.where(coding, base + (t[:, None] + self.frame_start_off) % 3, 6)
            idx_e = torch.where(coding, base + (t[:, None] + self.frame_end_off) % 3, 6)
            C = self.num_classes
            ps = -G[:, :T].gather(2, idx_s[None].expand(B, T, C))
            pe = G[:, 1:].gather(2, idx_e[None].expand(B, T, C))
            # a stop codon whose first base is within 2 bases of an exon's 3' end runs past the exon:
            # it is not a codon of this exon, so take its penalty back
            sp = pen[0] * stops[..., 0]
            sm = pen[1] * stops[..., 1]
            sp_prev = torch.cat([sp.new_zeros(B, 1), sp[:, :-1]], dim=1)
            sm_next = torch.cat([sm[:, 1:], sm.new_zeros(B, 1)], dim=1)
            end0 = (self.frame_stop_end == 0).to(dtype)
            end1 = (self.frame_stop_end == 1).to(dtype)
            start0 = (self.frame_stop_start == 0).to(dtype)
            start1 = (self.frame_stop_start == 1).to(dtype)
            pe = pe + sp[..., None] * end0 + sp_prev[..., None] * end1
            ps = ps + sm[..., None] * start0 + sm_next[..., None] * start1
            # fixed penalties where a splice site, start or stop codon lacks its consensus
            ps = ps + self._signal_scores(viol, out.lengths, "ps")
            pe = pe + self._signal_scores(viol, out.lengths, "pe")
            proj_start = out.proj_start + torch.where(valid, ps, zero)
            proj_end = out.proj_end + torch.where(valid, pe, zero)
        return out._replace(proj_start=proj_start, proj_end=proj_end)


    def _signal_scores(self, viol: torch.Tensor, lengths: torch.Tensor, side: str) -> torch.Tensor:
        """(B, T, C): ``-P`` where a label's checked signal is absent at a segment's start (``side="ps"``)
        or end (``"pe"``), ``+P`` where a continuation piece takes back its neighbour's check."""
        B, T, _ = viol.shape
        P = self.signal_penalty
        t = torch.arange(T, device=viol.device)
        valid = (t[None, :] < lengths[:, None])[..., None]
        viol = torch.where(valid, viol, viol.new_zeros(()))
        zero = viol.new_zeros(B, T, 1)
        if side == "ps":
            kind, bonus_kind = self.signal_ps_kind, self.signal_ps_bonus_kind
            # the check of the piece that ends at s - 1
            shifted = torch.cat([viol.new_zeros(B, 1, viol.shape[2]), viol[:, :-1]], dim=1)
        else:
            kind, bonus_kind = self.signal_pe_kind, self.signal_pe_bonus_kind
            # the check of the piece that starts at e + 1 (none past the sequence's end)
            shifted = torch.cat([viol[:, 1:], viol.new_zeros(B, 1, viol.shape[2])], dim=1)
        C = self.num_classes
        penalty = torch.cat([viol, zero], dim=2).gather(2, kind.remainder(9)[None, None].expand(B, T, C))
        bonus = torch.cat([shifted, zero], dim=2).gather(2, bonus_kind.remainder(9)[None, None].expand(B, T, C))
        return P * (bonus - penalty)

    @torch.no_grad()
    def init_from_gold(self, segmentations: Sequence[Sequence[tuple]], smoothing: float = 1.0, ridge: float = 1.0) -> None:
        """Start the transitions and durations at the gold segmentations' statistics, as a GHMM is trained.

        Transitions: ``log P(b | a)`` from counts of consecutive gold segments (+ ``smoothing``).
        Durations: ridge-regularised least-squares fit of the duration basis to the log of a kernel
        density estimate (in log k) of each label's gold durations, over its allowed durations.
        """
        C, K = self.num_classes, self.max_duration
        counts = torch.zeros(C, C, dtype=torch.float64)
        durs: List[List[int]] = [[] for _ in range(C)]
        for segs in segmentations:
            for (s0, e0, a), (s1, e1, b) in zip(segs, segs[1:]):
                counts[a, b] += 1
            for s, e, c in segs:
                durs[c].append(e - s)
        # the statistics are computed on the CPU and copied into the parameters, wherever they live
        allowed = self.allowed_transitions.cpu()
        counts = (counts + smoothing) * allowed.double()
        logp = torch.log(counts / counts.sum(1, keepdim=True).clamp(min=1e-30)).clamp(min=-30.0)
        self.transition.copy_(torch.where(allowed, logp, torch.zeros_like(logp)).float())
        dist = self.duration_dist.fn
        k = torch.arange(1, K + 1, dtype=torch.float64)
        logk = torch.log(k)
        phi = torch.exp(-0.5 * ((logk[:, None] - dist.centres.cpu().double()[None, :]) / dist.width) ** 2)
        weight = dist.weight.detach().cpu().clone()
        masks = dist.mask.cpu()
        for c in range(C):
            mask = masks[:, c]
            d = torch.tensor(durs[c], dtype=torch.float64)
            if len(d) == 0:
                continue
            # density in log k, turned into a density over k (1/k), normalised over allowed k
            kde = torch.exp(-0.5 * ((logk[:, None] - torch.log(d)[None, :]) / dist.width) ** 2).sum(1) / k
            p = torch.where(mask, kde + 1e-3 * kde[mask].mean(), torch.zeros_like(kde))
            y = torch.log(p[mask] / p[mask].sum())
            # ridge regression: basis functions over durations a label never takes stay tame
            A = phi[mask]
            sol = torch.linalg.solve(A.T @ A + ridge * torch.eye(A.shape[1], dtype=A.dtype), A.T @ y)
            weight[:, c] = sol.float()
        dist.weight.copy_(weight)


class SemiCRFGeneFinder(nn.Module):
    """DNA encoder + :class:`GeneStructureHead`."""

    kind = "semicrf"

    def __init__(self, max_duration: int = 960, hidden: int = 64, encoder: Optional[dict] = None,
                 aux_weight: float = 0.5, **head_kwargs):
        super().__init__()
        self.grammar = GeneGrammar()
        self.encoder = DNAEncoder(hidden, **(encoder or {}))
        self.head = GeneStructureHead(max_duration, hidden, self.grammar, **head_kwargs)
        self.aux = _AuxLoss(hidden, aux_weight)

    def head_inputs(self, codes: torch.Tensor, h: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(B, T, H + 10): encoder features, stop-codon tracks, signal tracks."""
        h = self.encoder(codes) if h is None else h
        return torch.cat([h, stop_codon_tracks(codes), signal_violations(codes)], dim=-1)

    def loss(self, batch: Dict) -> torch.Tensor:
        h = self.encoder(batch["codes"])
        nll = self.head.compute_loss(self.head_inputs(batch["codes"], h), batch["lengths"],
                                     segments=batch["segments"], reduction="token_mean")
        return nll + self.aux(h, batch)

    @torch.no_grad()
    def predict_segments(self, codes: torch.Tensor, lengths: torch.Tensor) -> List[List[tuple]]:
        res = self.head.decode(self.head_inputs(codes), lengths)
        return [[(int(s.start), int(s.end), int(s.label)) for s in segs] for segs in res.segments]

    @torch.no_grad()
    def predict_genes(self, codes: torch.Tensor, lengths: torch.Tensor) -> List[List[Gene]]:
        return [self.grammar.decode(segs) for segs in self.predict_segments(codes, lengths)]

    @torch.no_grad()
    def posteriors(self, codes: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B, T, 3): posterior probability of coding, intron and intergenic at each position."""
        post = self.head.marginals(self.head_inputs(codes), lengths).position
        kinds = [lab.kind for lab in self.grammar.labels]
        groups = [[c for c, k in enumerate(kinds) if k in ("exon", "cont")],
                  [c for c, k in enumerate(kinds) if k == "intron"],
                  [c for c, k in enumerate(kinds) if k == "intergenic"]]
        return torch.stack([post[..., g].sum(-1) for g in groups], dim=-1)


class _AuxLoss(nn.Module):
    """``weight`` x the softmax baseline's per-position cross-entropy (codon labels), on the encoder's
    features: an auxiliary loss that trains a CRF model's encoder faster. Not used for prediction."""

    def __init__(self, hidden: int, weight: float):
        super().__init__()
        self.weight = float(weight)
        self.out = nn.Linear(hidden, CodonLabels().num_labels) if weight > 0 else None

    def forward(self, h: torch.Tensor, batch: Dict) -> torch.Tensor:
        if self.out is None:
            return h.new_zeros(())
        logits = self.out(h)
        return self.weight * F.cross_entropy(logits.transpose(1, 2), batch["labels"], ignore_index=-100)


class CodonCRFTagger(nn.Module):
    """DNA encoder + linear-chain CRF (a semi-CRF head with K = 1) over codon-position labels."""

    kind = "crf"

    def __init__(self, hidden: int = 64, encoder: Optional[dict] = None, aux_weight: float = 0.5, **head_kwargs):
        super().__init__()
        self.labels = CodonLabels()
        self.encoder = DNAEncoder(hidden, **(encoder or {}))
        self.head = SemiMarkovCRFHead(self.labels.num_labels, 1, hidden_dim=hidden,
                                      allowed_transitions=self.labels.allowed_transitions(), **head_kwargs)
        self.aux = _AuxLoss(hidden, aux_weight)

    def loss(self, batch: Dict) -> torch.Tensor:
        h = self.encoder(batch["codes"])
        nll = self.head.compute_loss(h, batch["lengths"], labels=batch["labels"], reduction="token_mean")
        return nll + self.aux(h, batch)

    @torch.no_grad()
    def init_from_gold(self, labels: Sequence[np.ndarray], smoothing: float = 1.0) -> None:
        """Start the transitions at ``log P(b | a)`` of consecutive gold labels (+ ``smoothing``)."""
        C = self.labels.num_labels
        counts = torch.zeros(C, C, dtype=torch.float64)
        for lab in labels:
            lab = torch.as_tensor(np.asarray(lab))
            counts.index_put_((lab[:-1], lab[1:]), torch.ones(len(lab) - 1, dtype=torch.float64), accumulate=True)
        allowed = self.head.allowed_transitions.cpu()
        counts = (counts + smoothing) * allowed.double()
        logp = torch.log(counts / counts.sum(1, keepdim=True)).clamp(min=-30.0)
        self.head.transition.copy_(torch.where(allowed, logp, torch.zeros_like(logp)).float())

    @torch.no_grad()
    def predict_labels(self, codes: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.head.decode(self.encoder(codes), lengths).labels

    @torch.no_grad()
    def predict_genes(self, codes: torch.Tensor, lengths: torch.Tensor) -> List[List[Gene]]:
        lab = self.predict_labels(codes, lengths).cpu()
        return [self.labels.decode(lab[b, : int(L)].numpy()) for b, L in enumerate(lengths.tolist())]


class CodonSoftmaxTagger(nn.Module):
    """DNA encoder + per-position softmax over codon-position labels."""

    kind = "softmax"

    def __init__(self, hidden: int = 64, encoder: Optional[dict] = None):
        super().__init__()
        self.labels = CodonLabels()
        self.encoder = DNAEncoder(hidden, **(encoder or {}))
        self.out = nn.Linear(hidden, self.labels.num_labels)

    def loss(self, batch: Dict) -> torch.Tensor:
        logits = self.out(self.encoder(batch["codes"]))
        return F.cross_entropy(logits.transpose(1, 2), batch["labels"], ignore_index=-100)

    @torch.no_grad()
    def predict_labels(self, codes: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.out(self.encoder(codes)).argmax(-1)

    @torch.no_grad()
    def predict_genes(self, codes: torch.Tensor, lengths: torch.Tensor) -> List[List[Gene]]:
        lab = self.predict_labels(codes, lengths).cpu()
        return [self.labels.decode(lab[b, : int(L)].numpy()) for b, L in enumerate(lengths.tolist())]


def build_model(kind: str, max_duration: int = 960, hidden: int = 64, encoder: Optional[dict] = None, **kwargs) -> nn.Module:
    """One of :data:`MODEL_KINDS`: ``"semicrf"``, ``"crf"`` (K = 1) or ``"softmax"``."""
    if kind == "semicrf":
        return SemiCRFGeneFinder(max_duration, hidden, encoder, **kwargs)
    if kind == "crf":
        return CodonCRFTagger(hidden, encoder, **kwargs)
    if kind == "softmax":
        return CodonSoftmaxTagger(hidden, encoder)
    raise ValueError(f"model kind must be one of {MODEL_KINDS}, got {kind!r}")

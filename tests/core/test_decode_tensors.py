"""Tensor-first decoding: ``ViterbiResult``'s segment tensors, their offsets and the lazy lists."""

import math

import pytest
import torch

from conftest import CPU_BACKENDS, make_inputs
from torch_semimarkov import SemiMarkovCRFHead, Segment, ViterbiResult, semi_crf_streaming_viterbi
from torch_semimarkov.core.segments import labels_to_segments, segment_tensors


def _segments_from_tensors(res):
    """Per-sequence lists rebuilt from the tensors alone (the reference for ``segments``)."""
    s, e, c, o = (x.tolist() for x in (res.segment_starts, res.segment_ends, res.segment_labels,
                                       res.segment_offsets))
    return [[Segment(s[i], e[i], c[i]) for i in range(o[b], o[b + 1])] for b in range(len(o) - 1)]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("kcc", [False, True])
def test_segment_tensors_tile_each_sequence_and_match_the_labels(backend, kcc):
    inp = make_inputs(5, 17, 4, 3, seed=3, lengths=[17, 1, 9, 16, 4], duration_transitions=kcc, proj="both")
    res = semi_crf_streaming_viterbi(**inp, backend=backend)
    B, T = res.labels.shape
    off = res.segment_offsets
    assert off.shape == (B + 1,) and off[0] == 0 and off[-1] == res.segment_starts.numel()
    assert all(t.dtype == torch.long for t in (res.segment_starts, res.segment_ends, res.segment_labels, off))
    assert torch.equal(res.num_segments, off.diff())
    lens = inp["lengths"].tolist()
    for b in range(B):
        s = res.segment_starts[off[b]:off[b + 1]]
        e = res.segment_ends[off[b]:off[b + 1]]
        c = res.segment_labels[off[b]:off[b + 1]]
        # the segments tile [0, L) in order, each within the maximum duration
        assert s[0] == 0 and e[-1] == lens[b]
        assert torch.equal(s[1:], e[:-1])
        assert bool(((e - s) >= 1).all()) and bool(((e - s) <= inp["K"]).all())
        # and carry the per-position labels
        for si, ei, ci in zip(s.tolist(), e.tolist(), c.tolist()):
            assert (res.labels[b, si:ei] == ci).all()
    # the lazily built lists are the tensors' segments
    assert res.segments == _segments_from_tensors(res)


def test_segment_list_is_built_only_when_asked_for():
    inp = make_inputs(2, 9, 3, 2, seed=1)
    res = semi_crf_streaming_viterbi(**inp, backend="torch")
    assert res._segments is None
    first = res.segments
    assert res._segments is not None and res.segments is first  # built once, cached


def test_impossible_sequence_has_no_segment_tensors():
    inp = make_inputs(3, 6, 2, 2, seed=0)
    # sequence 1 cannot be segmented: every duration of label 0 and 1 is forbidden
    inp["cum_scores"] = inp["cum_scores"].clone()
    db = inp["duration_bias"].clone()
    db[:] = -math.inf
    db[0, 0] = 0.0  # only duration-1 segments of label 0 ...
    inp["duration_bias"] = db
    tr = torch.full((2, 2), -math.inf, dtype=torch.float64)
    tr[1, 0] = 0.0  # ... entered only from label 1: one segment, so only length 1 can be segmented
    inp["transition"] = tr
    inp["lengths"] = torch.tensor([1, 6, 1])
    res = semi_crf_streaming_viterbi(**inp, backend="torch")
    assert res.scores[1] == -math.inf
    assert res.num_segments.tolist() == [1, 0, 1]
    assert res.segments[1] == [] and res.segments[0] == [Segment(0, 1, 0)]
    assert res.segment_offsets.tolist() == [0, 1, 1, 2]


def test_segment_tensors_helper_handles_empty_batches_and_starts_past_the_length():
    lab = torch.tensor([[1, 1, 0, -1, -1]])
    st = torch.tensor([[True, False, True, True, False]])  # a stray start past the length is ignored
    s, e, c, o = segment_tensors(lab, st, torch.tensor([3]))
    assert (s.tolist(), e.tolist(), c.tolist(), o.tolist()) == ([0, 2], [2, 3], [1, 0], [0, 2])
    s, e, c, o = segment_tensors(torch.empty(0, 4, dtype=torch.long), torch.empty(0, 4, dtype=torch.bool),
                                 torch.empty(0, dtype=torch.long))
    assert s.numel() == 0 and o.tolist() == [0]


def test_segment_tensors_agree_with_labels_to_segments_when_no_adjacent_segments_share_a_label():
    lab = torch.tensor([[0, 0, 2, 2, 2, 1], [3, 3, 3, 0, -1, -1]])
    starts = torch.zeros_like(lab, dtype=torch.bool)
    starts[:, 0] = True
    starts[:, 1:] = lab[:, 1:] != lab[:, :-1]
    res = ViterbiResult.from_boundaries(torch.zeros(2), lab, starts, torch.tensor([6, 4]))
    assert res.segments == labels_to_segments(lab, torch.tensor([6, 4]))


def test_head_decode_returns_the_tensor_first_result():
    torch.manual_seed(0)
    head = SemiMarkovCRFHead(3, 4, hidden_dim=5, backend="torch")
    res = head.decode(torch.randn(2, 11, 5), torch.tensor([11, 6]))
    assert isinstance(res, ViterbiResult)
    assert res.segment_ends[res.segment_offsets[1:] - 1].tolist() == [11, 6]
    assert "segments=" in repr(res)

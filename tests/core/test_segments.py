"""Conversion between per-position labels and segments."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_semimarkov.streaming import Segment, labels_to_segments, segments_to_labels
from torch_semimarkov.core.segments import segments_from_boundaries


def test_segment_fields_and_duration():
    s = Segment(2, 5, 1)
    assert (s.start, s.end, s.label) == (2, 5, 1)
    assert s.duration == 3
    assert s == (2, 5, 1)


def test_labels_to_segments_runs():
    got = labels_to_segments(torch.tensor([[0, 0, 2, 2, 2, 1]]))
    assert got == [[Segment(0, 2, 0), Segment(2, 5, 2), Segment(5, 6, 1)]]


def test_labels_to_segments_1d_input():
    assert labels_to_segments(torch.tensor([3, 3, 3])) == [[Segment(0, 3, 3)]]


def test_labels_to_segments_with_lengths_ignores_padding():
    labels = torch.tensor([[1, 1, 0, 0, 0], [2, 0, 7, 7, 7]])
    got = labels_to_segments(labels, torch.tensor([5, 2]))
    assert got == [[Segment(0, 2, 1), Segment(2, 5, 0)], [Segment(0, 1, 2), Segment(1, 2, 0)]]


def test_labels_to_segments_stops_at_first_negative_label_without_lengths():
    got = labels_to_segments(torch.tensor([[1, 1, 0, -1, -1], [4, 4, 4, 4, 4]]))
    assert got == [[Segment(0, 2, 1), Segment(2, 3, 0)], [Segment(0, 5, 4)]]


def test_labels_to_segments_rejects_bad_input():
    with pytest.raises(ValueError, match="labels"):
        labels_to_segments(torch.zeros(2, 3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="lengths"):
        labels_to_segments(torch.zeros(2, 3, dtype=torch.long), torch.tensor([3, 3, 3]))
    with pytest.raises(ValueError, match="negative"):
        labels_to_segments(torch.tensor([[0, -1, 0]]), torch.tensor([3]))


def test_segments_to_labels_pads_with_fill_value():
    got = segments_to_labels([[Segment(0, 2, 1), Segment(2, 3, 0)], [Segment(0, 1, 2)]], T=4)
    assert torch.equal(got, torch.tensor([[1, 1, 0, -1], [2, -1, -1, -1]]))
    assert got.dtype == torch.long
    got = segments_to_labels([[Segment(0, 1, 5)]], T=2, fill_value=9)
    assert torch.equal(got, torch.tensor([[5, 9]]))


def test_segments_to_labels_infers_t():
    got = segments_to_labels([[Segment(0, 3, 1)], [Segment(0, 1, 0), Segment(1, 2, 2)]])
    assert tuple(got.shape) == (2, 3)


def test_segments_to_labels_rejects_out_of_range():
    with pytest.raises(ValueError, match="segment"):
        segments_to_labels([[Segment(0, 5, 1)]], T=4)
    with pytest.raises(ValueError, match="segment"):
        segments_to_labels([[Segment(2, 2, 1)]], T=4)


def test_segments_from_boundaries_keeps_adjacent_same_label_segments_apart():
    labels = np.array([1, 1, 1, 0, 0, -1])
    starts = np.array([True, False, True, True, False, False])
    got = segments_from_boundaries(labels, starts, 5)
    assert got == [Segment(0, 2, 1), Segment(2, 3, 1), Segment(3, 5, 0)]
    assert all(isinstance(x, int) for s in got for x in s)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=30), st.integers(0, 5))
def test_round_trip_labels_segments_labels(labels, pad):
    L = len(labels)
    row = torch.tensor(labels + [-1] * pad)[None]
    segs = labels_to_segments(row, torch.tensor([L]))
    # runs are maximal: neighbours differ, they tile 0..L-1
    assert segs[0][0].start == 0 and segs[0][-1].end == L
    assert all(a.end == b.start and a.label != b.label for a, b in zip(segs[0], segs[0][1:]))
    assert torch.equal(segments_to_labels(segs, L + pad), row)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 3)), min_size=1, max_size=12))
def test_round_trip_segments_boundaries(parts):
    segs, s = [], 0
    for k, c in parts:
        segs.append(Segment(s, s + k, c))
        s += k
    labels = segments_to_labels([segs], s)[0].numpy()
    starts = np.zeros(s, dtype=bool)
    for seg in segs:
        starts[seg.start] = True
    assert segments_from_boundaries(labels, starts, s) == segs

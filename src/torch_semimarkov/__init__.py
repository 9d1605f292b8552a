"""torch-semimarkov: exact semi-Markov CRFs on very long sequences.

The streaming engine (:mod:`torch_semimarkov.streaming`) computes the log partition, its
gradients, Viterbi segmentations and posterior marginals in O(K·C) forward memory, plus k-best lists, exact samples, the entropy and
partial-label (masked) training, on the CPU with
a compiled engine (numba) or PyTorch, and on NVIDIA GPUs with Triton kernels.
"""

from torch_semimarkov.crf import SemiMarkovCRF
from torch_semimarkov.nn import SemiMarkovCRFHead
from torch_semimarkov.scores import cumulative_scores
from torch_semimarkov.streaming import (
    NEG_INF,
    MarginalsResult,
    Segment,
    SegmentationSamples,
    TopKResult,
    ViterbiResult,
    labels_to_segments,
    numba_available,
    segments_to_labels,
    semi_crf_streaming_entropy,
    semi_crf_streaming_forward,
    semi_crf_streaming_marginals,
    semi_crf_streaming_sample,
    semi_crf_streaming_topk,
    semi_crf_streaming_viterbi,
    triton_available,
)

__version__ = "0.1.0"

__all__ = [
    "NEG_INF",
    "MarginalsResult",
    "Segment",
    "SegmentationSamples",
    "SemiMarkovCRF",
    "SemiMarkovCRFHead",
    "TopKResult",
    "ViterbiResult",
    "cumulative_scores",
    "labels_to_segments",
    "numba_available",
    "segments_to_labels",
    "semi_crf_streaming_entropy",
    "semi_crf_streaming_forward",
    "semi_crf_streaming_marginals",
    "semi_crf_streaming_sample",
    "semi_crf_streaming_topk",
    "semi_crf_streaming_viterbi",
    "triton_available",
]


"""Streaming semi-CRF inference: O(K·C) forward state, checkpointed hand-written backward.

Public functions: :func:`semi_crf_streaming_forward` (log Z or Viterbi score),
:func:`semi_crf_streaming_viterbi` (best segmentations), :func:`semi_crf_streaming_marginals`
(posterior marginals), and beyond the best path :func:`semi_crf_streaming_topk` (k-best lists),
:func:`semi_crf_streaming_sample` (exact samples) and :func:`semi_crf_streaming_entropy`. See ``docs/internals.md`` for the algorithm.
"""

from .autograd import (
    MarginalsResult,
    SemiCRFStreaming,
    SemiCRFStreamingNumba,
    SemiCRFStreamingTriton,
    ViterbiResult,
    semi_crf_streaming_forward,
    semi_crf_streaming_marginals,
    semi_crf_streaming_viterbi,
    triton_available,
)
from .backends import BACKENDS, numba_available
from .distribution import (
    SegmentationSamples,
    TopKResult,
    semi_crf_streaming_entropy,
    semi_crf_streaming_sample,
    semi_crf_streaming_topk,
)
from .constants import NEG_INF
from .pytorch_reference import (
    semi_crf_streaming_backward_pytorch,
    semi_crf_streaming_forward_pytorch,
    semi_crf_streaming_viterbi_pytorch,
)
from .segments import Segment, labels_to_segments, segments_to_labels
from .validation import validate_streaming_inputs

__all__ = [
    "BACKENDS",
    "NEG_INF",
    "MarginalsResult",
    "Segment",
    "SegmentationSamples",
    "SemiCRFStreaming",
    "SemiCRFStreamingNumba",
    "SemiCRFStreamingTriton",
    "TopKResult",
    "ViterbiResult",
    "labels_to_segments",
    "numba_available",
    "segments_to_labels",
    "semi_crf_streaming_backward_pytorch",
    "semi_crf_streaming_entropy",
    "semi_crf_streaming_forward",
    "semi_crf_streaming_forward_pytorch",
    "semi_crf_streaming_marginals",
    "semi_crf_streaming_sample",
    "semi_crf_streaming_topk",
    "semi_crf_streaming_viterbi",
    "semi_crf_streaming_viterbi_pytorch",
    "triton_available",
    "validate_streaming_inputs",
]

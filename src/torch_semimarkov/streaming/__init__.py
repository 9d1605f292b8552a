"""The streaming semi-CRF functions under their historical module name (a face of :mod:`torch_semimarkov.api`).

Public functions: :func:`semi_crf_streaming_forward` (log Z or Viterbi score),
:func:`semi_crf_streaming_viterbi` (best segmentations), :func:`semi_crf_streaming_marginals`
(posterior marginals), and beyond the best path :func:`semi_crf_streaming_topk` (k-best lists),
:func:`semi_crf_streaming_sample` (exact samples) and :func:`semi_crf_streaming_entropy`. See ``docs/internals.md`` for the algorithm.
"""

from torch_semimarkov.api import (
    semi_crf_streaming_entropy,
    semi_crf_streaming_forward,
    semi_crf_streaming_marginals,
    semi_crf_streaming_sample,
    semi_crf_streaming_topk,
    semi_crf_streaming_viterbi,
)
from torch_semimarkov.core.constants import NEG_INF
from torch_semimarkov.core.results import MarginalsResult, SegmentationSamples, TopKResult, ViterbiResult
from torch_semimarkov.core.segments import Segment, labels_to_segments, segments_to_labels
from torch_semimarkov.core.validation import validate_streaming_inputs
from torch_semimarkov.engines.interface import NumbaEngine as SemiCRFStreamingNumba
from torch_semimarkov.engines.interface import TorchEngine as SemiCRFStreaming
from torch_semimarkov.engines.interface import TritonEngine as SemiCRFStreamingTriton
from torch_semimarkov.engines.available import numba_available, triton_available
from torch_semimarkov.engines.select import BACKENDS
from torch_semimarkov.engines.torch.reference import (
    semi_crf_streaming_backward_pytorch,
    semi_crf_streaming_forward_pytorch,
    semi_crf_streaming_viterbi_pytorch,
)

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

"""torch-semimarkov: exact semi-Markov CRFs on very long sequences.

The streaming engine (:mod:`torch_semimarkov.streaming`) computes the log partition, its
gradients, Viterbi segmentations and posterior marginals in O(K·C) forward memory, on the CPU with
PyTorch and on NVIDIA GPUs with Triton kernels.
"""

from .streaming import (
    NEG_INF,
    MarginalsResult,
    Segment,
    ViterbiResult,
    labels_to_segments,
    segments_to_labels,
    semi_crf_streaming_forward,
    semi_crf_streaming_marginals,
    semi_crf_streaming_viterbi,
    triton_available,
)

__version__ = "0.1.0"

__all__ = [
    "NEG_INF",
    "MarginalsResult",
    "Segment",
    "ViterbiResult",
    "labels_to_segments",
    "segments_to_labels",
    "semi_crf_streaming_forward",
    "semi_crf_streaming_marginals",
    "semi_crf_streaming_viterbi",
    "triton_available",
]

try:  # the head needs only torch; imported lazily-safe so a partial checkout still imports
    from .nn import SemiMarkovCRFHead  # noqa: F401

    __all__.append("SemiMarkovCRFHead")
except ImportError:  # pragma: no cover
    pass

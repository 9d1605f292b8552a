"""The public functions, one module per feature: log Z (partition), Viterbi, marginals, k-best,
samples, entropy, and the partial-label (constrained) variants they share."""

from torch_semimarkov.api.entropy import semi_crf_streaming_entropy
from torch_semimarkov.api.marginals import semi_crf_streaming_marginals
from torch_semimarkov.api.partition import semi_crf_streaming_forward
from torch_semimarkov.api.sample import semi_crf_streaming_sample
from torch_semimarkov.api.topk import semi_crf_streaming_topk
from torch_semimarkov.api.viterbi import semi_crf_streaming_viterbi

__all__ = [
    "semi_crf_streaming_entropy",
    "semi_crf_streaming_forward",
    "semi_crf_streaming_marginals",
    "semi_crf_streaming_sample",
    "semi_crf_streaming_topk",
    "semi_crf_streaming_viterbi",
]

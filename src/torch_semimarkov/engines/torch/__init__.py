"""The PyTorch engines (any device): the streaming reference of log Z / gradients / Viterbi
(:mod:`.reference`) and the float64 dense model with masks, entropy, sampling and k-best
(:mod:`.dense`)."""

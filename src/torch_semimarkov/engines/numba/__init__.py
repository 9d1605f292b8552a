"""The compiled CPU engine (numba): log Z, gradients, Viterbi, marginals, masks, samples, k-best and
the entropy, in float64, parallel over sequences. Loaded through
:func:`torch_semimarkov.engines.select.numba_engine` (numba is optional)."""

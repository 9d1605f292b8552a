"""The engines behind every public function, one interface (:mod:`.interface`) and one choice of
backend (:mod:`.select`): ``torch/`` (the PyTorch paths, the reference), ``numba/`` (the compiled
CPU engine, imported only when numba is installed) and ``triton/`` (the GPU kernels, imported only
when Triton is)."""

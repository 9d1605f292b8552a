"""Triton kernels of the streaming semi-CRF, one file per stage.

=================  ===========================================================================
``plan.py``        :class:`KernelPlan`: kernel kind, time-parallel or not, chunks, warps, tiles,
                   checkpoint layout, chosen once per call and reused by every later launch
``common.py``      Triton's optional import and the shared ``@triton.jit`` helpers
``forward.py``     forward recurrences (log and max): sequential and time-parallel (chunked)
``recompute.py``   every position's forward state from the sequential forward's checkpoints
``beta.py``        backward (beta) recurrences: sequential and time-parallel
``blocked.py``     forward and beta of rings too large for registers (genomics shapes): one
                   kernel, blocked in time, parallel over time
``tables.py``      the blocked engine's duration tables (and the linear sums' dense test) in one
                   launch
``marginals.py``   every marginal and parameter gradient, parallel over positions
``traceback.py``   Viterbi traceback: sequential and time-parallel
``parallel.py``    host side of the time-parallel engine (the three phases, chunk offsets)
``launch.py``      :func:`launch_forward`, :func:`launch_backward`, :func:`launch_viterbi`
=================  ===========================================================================

The algorithm and its notation are in ``docs/internals.md``.
"""

from torch_semimarkov.engines.triton.common import HAS_TRITON
from torch_semimarkov.engines.triton.plan import KernelPlan, make_plan

__all__ = ["HAS_TRITON", "KernelPlan", "make_plan"]

if HAS_TRITON:
    from torch_semimarkov.engines.triton.launch import ForwardState, launch_backward, launch_forward, launch_viterbi, plan_for  # noqa: F401

    __all__ += ["ForwardState", "launch_backward", "launch_forward", "launch_viterbi", "plan_for"]

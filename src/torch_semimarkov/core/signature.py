"""One calling convention for the public functions: the five engine inputs, then keyword options.

Every public streaming function takes ``cum_scores, transition, duration_bias, lengths, K``
positionally and everything else by keyword. Earlier releases took some options positionally,
each function in its own order; :func:`keyword_options` keeps those calls working (mapped to
their old names) and warns with the keyword form to use instead.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable

__all__ = ["keyword_options", "NUM_INPUTS"]

#: cum_scores, transition, duration_bias, lengths, K
NUM_INPUTS = 5


def keyword_options(*legacy: str) -> Callable:
    """Make a function's options after the five engine inputs keyword-only, accepting the old
    positional order ``legacy`` with a ``FutureWarning`` that shows the keyword form."""

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            if len(args) > NUM_INPUTS:
                extra = args[NUM_INPUTS:]
                if len(extra) > len(legacy):
                    raise TypeError(
                        f"{fn.__name__}() takes {NUM_INPUTS} positional arguments (cum_scores, transition, "
                        f"duration_bias, lengths, K) and keyword options, got {len(args)} positional arguments"
                    )
                names = legacy[:len(extra)]
                for name in names:
                    if name in kwargs:
                        raise TypeError(f"{fn.__name__}() got multiple values for argument {name!r}")
                shown = ", ".join(f"{n}={_short(v)}" for n, v in zip(names, extra))
                warnings.warn(
                    f"{fn.__name__}: the options after K are keyword-only; call "
                    f"{fn.__name__}(cum_scores, transition, duration_bias, lengths, K, {shown}) "
                    "(positional options will stop working in a future release)",
                    FutureWarning, stacklevel=2,
                )
                kwargs.update(zip(names, extra))
                args = args[:NUM_INPUTS]
            return fn(*args, **kwargs)

        return inner

    return wrap


def _short(value) -> str:
    """How a value appears in the warning: tensors by shape, others by repr."""
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"<tensor {tuple(shape)}>"
    text = repr(value)
    return text if len(text) <= 30 else text[:27] + "..."

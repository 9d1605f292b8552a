"""A pytest plugin that logs every Triton kernel launch the interpreter runs: the test, the
kernel, its grid, and every argument (tensors as shape and dtype, scalars and constexprs as
values, ``num_warps`` included), in order. Two logs of the same tests before and after a
host-side refactor are equal exactly when the refactor launches the same kernels the same way.

    TRITON_INTERPRET=1 LAUNCHLOG=/tmp/before.json PYTHONPATH=src:scripts \\
        python -m pytest -q -n 0 -p launch_log tests/engines/triton tests/api
    # ... change the code, log to /tmp/after.json, then compare the two JSON lists
"""

import json
import os

import pytest

LOG = []
_current = [None]


def _value(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if hasattr(v, "data_ptr"):
        return f"T{tuple(v.shape)}:{str(v.dtype).rpartition('.')[2]}"
    return repr(type(v))


def pytest_configure(config):
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.runtime import interpreter as interp

    call = interp.GridExecutor.__call__

    def logging_call(self, *args, **kwargs):
        LOG.append([_current[0], self.fn.__name__, "fn" if callable(self.grid) else repr(self.grid),
                    [_value(a) for a in args], {k: _value(v) for k, v in sorted(kwargs.items())}])
        return call(self, *args, **kwargs)

    interp.GridExecutor.__call__ = logging_call


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _current[0] = item.nodeid
    yield


def pytest_sessionfinish(session):
    json.dump(LOG, open(os.environ.get("LAUNCHLOG", "launch_log.json"), "w"))

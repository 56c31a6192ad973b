"""numba kernels; each module keeps a pure-numpy reference beside every kernel.

Nothing here imports numba at module import: ``numba_or_none()`` does it on first use, so
``import ember`` stays light, and the numpy references serve where numba is absent.
"""

from __future__ import annotations

import os

_numba = False


def numba_or_none():
    """The numba module, or None when it is not installed or EMBER_NO_NUMBA=1."""
    global _numba
    if _numba is False:
        # numba's OpenMP workers spin while they wait by default. With another busy process on
        # the machine that turns a 40 us matrix-vector product into a 13 ms one (the spinning
        # workers hold the core the main thread needs); passive waiting costs microseconds.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        if os.environ.get("EMBER_NO_NUMBA") == "1":
            _numba = None
        else:
            try:
                import numba
            except ImportError:  # pragma: no cover - numba is a required dependency
                numba = None
            _numba = numba
            if numba is not None:
                from ember.threads import apply_numba_threads

                apply_numba_threads()
    return _numba

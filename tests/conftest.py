import os

import numpy as np
import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    # Under pytest-xdist each worker shares the cores with the others: one thread per worker for
    # BLAS, numba and torch, so that no worker's threads spin-wait on a core another one needs.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        import ember
        from ember.kernels.cpu import numba_or_none

        ember.set_num_threads(1)
        numba_or_none()  # numba's OpenMP start resets the shared libgomp count: start it first
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    np.random.seed(0)
    import ember

    ember.manual_seed(0)
    yield


@pytest.fixture
def float_activations(monkeypatch):
    """Quantized products with float activations (EMBER_QUANT_DOT=float): for checks that hold
    them to the float product of the dequantized weight (the int8-activation kernels, the
    default for Q4_0/Q4_1 up to 16 rows, have their own bound in tests/kernels/quant)."""
    from ember import config

    monkeypatch.setattr(config, "QUANT_DOT", "float")

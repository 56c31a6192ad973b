import os

import numpy as np
import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _seed():
    np.random.seed(0)
    import ember

    ember.manual_seed(0)
    yield

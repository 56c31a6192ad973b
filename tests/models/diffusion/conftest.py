import pytest

import ember
from tests.models.diffusion.tiny import save_pipeline


@pytest.fixture(scope="session")
def sd(tmp_path_factory):
    """(folder, diffusers pipeline) of the tiny random Stable Diffusion (DDIM scheduler)."""
    folder = tmp_path_factory.mktemp("tiny_sd")
    return folder, save_pipeline(folder)


@pytest.fixture(autouse=True)
def _no_grad():
    with ember.no_grad():
        yield

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """References run tiny ops: one torch thread is far faster than two fighting for the cores."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)

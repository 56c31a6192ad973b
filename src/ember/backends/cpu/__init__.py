"""The CPU backend: numpy arrays; numba kernels in kernels/ beside their numpy references."""

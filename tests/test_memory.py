"""ember.memory: glibc keeps freed arrays for reuse unless EMBER_MALLOC=system."""

import os
import subprocess
import sys

import pytest

# a loop that allocates and frees 8 MB arrays, as a forward pass does; prints the page faults
# of its last 20 rounds (after the first rounds warmed the heap up)
_LOOP = """
import resource, sys
import numpy as np
import ember
def rounds(n):
    for _ in range(n):
        a = np.ones((2 << 20,), np.float32); b = a * 2.0; del a; c = b + 1.0; del b, c
rounds(5)
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds(20)
print(ember.memory.keep_freed_memory(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def _run(env: dict) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", _LOOP], env={**os.environ, **env}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    applied, faults = out.stdout.split()
    return applied == "True", int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_freed_arrays_are_reused_without_page_faults():
    applied, faults = _run({"EMBER_MALLOC": "keep"})
    if not applied:
        pytest.skip("this C library has no mallopt (not glibc)")
    # 20 rounds x 3 arrays x 2048 pages would fault ~120k times if each went back to the system
    assert faults < 2000
    applied, faults_system = _run({"EMBER_MALLOC": "system"})
    assert not applied
    assert faults_system > 10 * max(faults, 100)


def test_bad_malloc_value_is_a_clear_error():
    out = subprocess.run(
        [sys.executable, "-c", "import ember"],
        env={**os.environ, "EMBER_MALLOC": "jemalloc"},
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "EMBER_MALLOC='jemalloc': expected one of keep, system" in out.stderr


def test_release_file_pages(tmp_path):
    """A view of a read-only memory map gives its pages back and still reads the same bytes;
    any other array is left alone."""
    import mmap

    import numpy as np

    from ember.memory import release_file_pages

    data = np.random.default_rng(0).integers(0, 256, 5 * mmap.PAGESIZE, dtype=np.uint8)
    path = tmp_path / "w.bin"
    path.write_bytes(data.tobytes())
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = np.frombuffer(mm, np.uint8, 3 * mmap.PAGESIZE, 100)
    assert int(view.sum()) == int(data[100 : 100 + 3 * mmap.PAGESIZE].sum())  # resident now
    assert release_file_pages(view) == 2 * mmap.PAGESIZE  # the whole pages inside it
    np.testing.assert_array_equal(view, data[100 : 100 + 3 * mmap.PAGESIZE])
    anon = data.copy()
    assert release_file_pages(anon) == 0
    np.testing.assert_array_equal(anon, data)
    del view
    mm.close()

import os

import jax
import pytest

# the library's persistent compilation cache (numpyro_lm.runtime.compilation_cache) stays off in
# tests: nothing written to the home directory, and no test passes on another run's programs;
# tests/runtime/test_compilation_cache.py switches it on in a temporary directory
os.environ.setdefault("NUMPYRO_LM_COMPILATION_CACHE", "off")


def _with_x64(enabled: bool):
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", enabled)
    yield
    jax.config.update("jax_enable_x64", previous)


@pytest.fixture
def x64():
    """Run a test in float64 and restore the previous setting afterwards."""
    yield from _with_x64(True)


@pytest.fixture
def x32():
    """Run a test in float32 (the library must work there too)."""
    yield from _with_x64(False)


@pytest.fixture(autouse=True, scope="module")
def _fresh_jax_caches():
    """Drop each module's compiled programs after it: a worker otherwise holds the executables
    of every module it ran (two full runs of 460 tests segfaulted once each inside XLA's
    compiler, late in a worker's life)."""
    yield
    jax.clear_caches()

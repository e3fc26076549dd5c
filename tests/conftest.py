import jax
import pytest


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

import os

# two CPU devices, so that run_many's sharding across devices is exercised (before JAX starts)
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()

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

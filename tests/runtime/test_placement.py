"""Which device a fit runs on (numpyro_lm/runtime/placement.py): the rule, the refusals, and a fit
placed on a second CPU device giving the numbers of the default one."""

import os
import subprocess
import sys

import pytest

import numpyro_lm.runtime.placement as placement
from numpyro_lm import LaplaceMatching
from numpyro_lm.runtime.placement import PLACEMENT_NUMBERS, check_device, fit_device


def _model():
    pass


@pytest.mark.parametrize("default, device, numbers, expected", [
    ("cpu", "auto", 10, None),  # a CPU-only machine: nothing changes
    ("cpu", "auto", 10**7, None),
    ("gpu", "auto", PLACEMENT_NUMBERS - 1, "host"),  # small fits stay on the host CPU
    ("gpu", "auto", PLACEMENT_NUMBERS, None),  # large ones go to the default accelerator
    ("gpu", "default", 10, None),
    ("gpu", "cpu", 10**7, "host"),
    ("cpu", "cpu", 10, "host"),
])
def test_small_fits_stay_on_the_host_where_an_accelerator_is_the_default(monkeypatch, default, device, numbers,
                                                                          expected):
    monkeypatch.setattr(placement, "_default_platform", lambda: default)
    monkeypatch.setattr(placement, "_host_cpu", lambda: "host")
    assert fit_device(device, numbers) == expected


def test_a_device_given_is_the_device_used():
    import jax

    device = jax.devices()[0]
    assert fit_device(device, 10) is device and fit_device(device, 10**8) is device


@pytest.mark.parametrize("bad", ["gpu", "cuda:0", 0, None])
def test_bad_device_options_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="device must be"):
        check_device(bad)
    with pytest.raises(ValueError, match="device must be"):
        LaplaceMatching(_model, device=bad)


PLACED = """
import jax, numpy as np, numpyro, numpyro.distributions as dist
from numpyro_lm import LaplaceMatching
assert len(jax.devices()) == 2
def model(y):
    rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
    with numpyro.plate("n", y.shape[-1]):
        numpyro.sample("y", dist.Poisson(rate), obs=y)
y = np.array([1.0, 3.0, 2.0, 4.0], np.float32)
second = jax.devices()[1]
here = LaplaceMatching(model, num_samples=50, device=second).run(jax.random.PRNGKey(0), y)
there = LaplaceMatching(model, num_samples=50).run(jax.random.PRNGKey(0), y)
draws = here.get_samples()["rate"]
assert draws.devices() == {second}, draws.devices()
assert here.gaussian.mean.devices() == {second}
np.testing.assert_allclose(np.asarray(draws), np.asarray(there.get_samples()["rate"]), rtol=1e-6)
many = LaplaceMatching(model, num_samples=50, device=second).run_many(jax.random.PRNGKey(0), np.stack([y, y + 1]))
assert many.get_samples()["rate"].devices() == {second}
print("placed")
"""


@pytest.mark.slow
def test_a_fit_placed_on_another_device_stays_there_and_gives_the_same_numbers():
    # a fresh process: XLA's device count is fixed when JAX starts
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", PLACED], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "placed" in done.stdout, done.stderr[-3000:]

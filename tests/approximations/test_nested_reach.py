"""What a lattice over every coordinate does not reach (numpyro_lm/approximations/nested/reach.py)."""

import warnings

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist

from numpyro_lm import LaplaceMatching
from numpyro_lm.approximations.nested.reach import unreached


def double_well():
    x = numpyro.sample("x", dist.Normal(0.0, 10.0))
    numpyro.factor("potential", -4.0 * (x**2 - 1.0) ** 2)  # wells at +-1, 4 nats above the valley


def normal_unknown_scale(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def test_a_second_well_beyond_the_lattice_is_found_by_its_edge_and_the_scan():
    """The lattice around one well stops at its extent, 10 SDs of the well, inside the valley:
    its edge holds mass and the scan finds the other well (11 SDs away) as high as the first."""
    lm = LaplaceMatching(double_well, hyper=["x"]).run(jax.random.PRNGKey(0))
    reasons = unreached(lm._result)
    assert len(reasons) == 2 and "edge of the lattice" in reasons[0] and "another mode" in reasons[1]


def test_nothing_is_beyond_the_lattice_of_a_single_mode():
    y = np.array([1.2, -0.4, 2.5, 0.9, 3.1], np.float32)
    lm = LaplaceMatching(normal_unknown_scale, hyper=["mu", "sigma"]).run(jax.random.PRNGKey(0), y)
    assert unreached(lm._result) == []


def test_the_auto_pilot_tries_the_lattice_last_and_trusts_it_only_with_nothing_beyond():
    """The double well: Laplace, PSIS and the lattice all untrusted, the lattice for what lies beyond it."""
    lm = LaplaceMatching(double_well, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the verdict is asserted below
        lm.run(jax.random.PRNGKey(0))
    trail = lm.diagnostics()["trail"]
    assert trail[-1]["candidate"] == "lattice" and not trail[-1]["trusted"]
    assert any("beyond the lattice" in r for r in trail[-1]["reasons"])
    assert not lm.diagnostics()["trusted"]


def test_after_the_auto_pilots_lattice_the_advice_does_not_suggest_it_again():
    lm = LaplaceMatching(double_well, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the verdict is asserted below
        lm.run(jax.random.PRNGKey(0))
    assert "hyper=['x']" not in lm.diagnostics()["verdict"]


def test_looking_beyond_the_lattice_compiles_nothing_on_new_data_of_the_same_shape():
    """The scanned grid's shape is fixed by the dimension, not by how many of its cells the lattice covers."""
    compiles = []

    def listener(name, duration, **kwargs):
        if name == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    lm = LaplaceMatching(normal_unknown_scale, hyper=["mu", "sigma"])
    lm.run(jax.random.PRNGKey(0), np.array([1.2, -0.4, 2.5, 0.9, 3.1], np.float32))
    unreached(lm._result)
    lm.run(jax.random.PRNGKey(0), np.array([0.3, 4.0, -2.2, 0.8, 1.9], np.float32))  # another lattice
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        unreached(lm._result)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []

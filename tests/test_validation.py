"""Bad arguments of the public entry points: refused before any work, naming the argument and the fix."""

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_lm import LaplaceMatching
from numpyro_lm.checks.validation import MCMC_ONLY_OPTIONS

Y = np.arange(5.0)


def normal(y=None):
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    numpyro.sample("y", dist.Normal(mu, 1).expand([5]).to_event(1), obs=y)


class ClassModel:
    def __call__(self, y=None):
        normal(y)


@pytest.mark.parametrize("model, match", [
    (None, "must be a NumPyro model"),
    ("model", "must be a NumPyro model"),
    (ClassModel, "pass an instance"),
])
def test_a_model_that_is_not_one_is_refused(model, match):
    with pytest.raises(TypeError, match=match):
        LaplaceMatching(model)


def test_a_model_instance_with_call_works():
    lm = LaplaceMatching(ClassModel(), progress_bar=False).run(jax.random.PRNGKey(0), y=Y)
    # conjugate: mu | y ~ Normal(sum(y) / 6, 1 / sqrt(6)), exact for Laplace
    np.testing.assert_allclose(lm.posterior["mu"].loc, Y.sum() / 6, rtol=1e-4)


@pytest.mark.parametrize("option", sorted(MCMC_ONLY_OPTIONS))
def test_mcmc_options_are_refused_with_the_reason(option):
    with pytest.raises(TypeError, match=f"takes no {option}="):
        LaplaceMatching(normal, **{option: 2})


def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_sample'"):
        LaplaceMatching(normal, num_sample=10)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"num_samples": 10.0}, TypeError, "num_samples must be an integer"),
    ({"num_samples": 0}, ValueError, "num_samples must be at least 1"),
    ({"num_samples": True}, TypeError, "num_samples must be an integer"),
    ({"max_iter": 0}, ValueError, "max_iter must be at least 1"),
    ({"tol": -1.0}, ValueError, "tol must be None or a positive number"),
    ({"regularize": -1.0}, ValueError, "regularize must be None"),
    ({"progress_bar": "yes"}, TypeError, "progress_bar must be True or False"),
    ({"num_starts": 0}, ValueError, "num_starts must be at least 1"),
    ({"refine": "eig", "refine_max_iter": -1}, ValueError, "refine_max_iter must be at least 0"),
])
def test_bad_options_are_refused_when_the_object_is_made(kwargs, error, match):
    with pytest.raises(error, match=match):
        LaplaceMatching(normal, **kwargs)


@pytest.mark.parametrize("key", [None, 0, np.array([1.0, 2.0]), jax.random.split(jax.random.PRNGKey(0), 3)])
def test_a_bad_rng_key_is_refused(key):
    with pytest.raises(TypeError, match="rng_key must be one JAX PRNG key"):
        LaplaceMatching(normal).run(key, y=Y)


def test_new_style_keys_work():
    lm = LaplaceMatching(normal, progress_bar=False).run(jax.random.key(0), y=Y)
    assert lm.get_samples()["mu"].shape == (1000,)


@pytest.mark.parametrize("init_params, match", [
    ({"nu": 1.0}, r"init_params names \['nu'\], which are not latent sites"),
    ({"mu": np.nan}, r"init_params\['mu'\] is not finite"),
    ([1.0], "init_params must be a dict"),
])
def test_bad_init_params_are_refused(init_params, match):
    with pytest.raises((TypeError, ValueError), match=match):
        LaplaceMatching(normal).run(jax.random.PRNGKey(0), y=Y, init_params=init_params)


def test_draw_counts_are_checked_where_draws_are_asked_for(capsys):
    lm = LaplaceMatching(normal, num_samples=1, progress_bar=False).run(jax.random.PRNGKey(0), y=Y)
    assert lm.get_samples()["mu"].shape == (1,)
    with pytest.raises(ValueError, match="print_summary needs at least 2 draws"):
        lm.print_summary()
    with pytest.raises(TypeError, match="num_samples must be an integer"):
        lm.get_samples(2.5)
    with pytest.raises(ValueError, match="num_samples must be at least 1"):
        lm.get_samples(0)


@pytest.mark.parametrize("entry", ["sbc", "compare", "EllipticalSlice"])
def test_every_entry_point_that_takes_a_model_checks_it(entry):
    from numpyro_lm import EllipticalSlice, sbc
    from numpyro_lm.compare import compare

    call = {"sbc": lambda m: sbc(m, y=Y), "compare": lambda m: compare(m, y=Y),
            "EllipticalSlice": lambda m: EllipticalSlice(m)}[entry]
    with pytest.raises(TypeError, match="pass an instance"):
        call(ClassModel)
    with pytest.raises(TypeError, match="must be a NumPyro model"):
        call(None)

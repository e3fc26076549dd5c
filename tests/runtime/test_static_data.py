"""Data arguments a model needs concretely stay static (as MCMC keeps them); the others are traced."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_lm import LaplaceMatching
from numpyro_lm.runtime.programs import split_inputs
from numpyro_lm.runtime.static_data import StaticArray, mark_static, static_where_needed


def grouped(group, y=None):
    # the plate size from the data in NumPy, as NumPyro's UCB admissions example does
    num_groups = int(np.max(group)) + 1
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    with numpyro.plate("groups", num_groups):
        z = numpyro.sample("z", dist.Normal(mu, 1))
    with numpyro.plate("obs", group.shape[0]):
        numpyro.sample("y", dist.Normal(z[group], 1), obs=y)


def data(num_groups=3, per_group=4, seed=0):
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(num_groups), per_group)
    return group, rng.normal(size=group.size) + group


def test_static_arrays_are_keyed_by_content():
    a = np.arange(4).view(StaticArray)
    same, other = np.arange(4).view(StaticArray), np.arange(1, 5).view(StaticArray)
    key = split_inputs((a,))[1]
    assert key == split_inputs((same,))[1] and hash(key) == hash(split_inputs((same,))[1])
    assert key != split_inputs((other,))[1]
    assert split_inputs((a,))[0] == []  # not traced


def test_only_the_arguments_needed_concretely_become_static():
    def trace(args, kwargs):  # an abstract trace: the first argument sizes an array, the second is data
        traced = [i for i, a in enumerate(args) if not isinstance(a, StaticArray)]

        def run(*arrays):
            values = list(args)
            for i, a in zip(traced, arrays):
                values[i] = a
            return jnp.zeros(int(np.max(values[0])) + 1) + jnp.sum(values[1])

        return jax.eval_shape(run, *[args[i] for i in traced])

    args, kwargs, out = static_where_needed(trace, (np.array([0, 2]), np.ones(3)), {})
    assert isinstance(args[0], StaticArray) and not isinstance(args[1], StaticArray)
    assert out.shape == (3,)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_a_model_that_sizes_its_plate_from_the_data_fits_and_refits():
    group, y = data()
    lm = LaplaceMatching(grouped, progress_bar=False)
    lm.run(jax.random.PRNGKey(0), group, y=y)
    args = lm.model_args
    assert isinstance(args[0], StaticArray)  # the group index: needed concretely
    assert not isinstance(lm.model_kwargs["y"], StaticArray)  # the observations: traced
    # conjugate Gaussian model: the Laplace fit is exact; z's posterior mean from the normal equations
    first = np.asarray(lm.posterior["z"].mean)
    # precision of (mu, z): mu ~ N(0, 1) and three z_j ~ N(mu, 1) give mu 1 + 3 and -1 to each z_j;
    # each z_j has its prior (1) and four observations (4)
    precision = np.zeros((4, 4))
    precision[0, 0] = 4.0
    precision[0, 1:] = precision[1:, 0] = -1.0
    precision[1:, 1:] = 5.0 * np.eye(3)
    b = np.concatenate([[0.0], [y[group == j].sum() for j in range(3)]])
    np.testing.assert_allclose(first, np.linalg.solve(precision, b)[1:], rtol=1e-4)
    # new data of the same shapes: a refit, the answer moves with the data
    lm.run(jax.random.PRNGKey(0), group, y=y + 1.0)
    assert not np.allclose(np.asarray(lm.posterior["z"].mean), first)


@pytest.mark.slow
def test_new_group_values_give_a_new_program_not_a_stale_one():
    group, y = data()
    lm = LaplaceMatching(grouped, progress_bar=False)
    lm.run(jax.random.PRNGKey(0), group, y=y)
    lm.run(jax.random.PRNGKey(0), np.repeat(np.arange(4), 3), y=y)  # four groups of three
    assert lm.posterior["z"].mean.shape == (4,)


def test_a_latent_value_in_python_control_flow_is_explained():
    def branching(y=None):
        sigma = numpyro.sample("sigma", dist.HalfNormal(1))
        if sigma > 1:  # Python on a traced latent value: not something static data can fix
            sigma = sigma * 2
        numpyro.sample("y", dist.Normal(0, sigma), obs=y)

    with pytest.raises(jax.errors.ConcretizationTypeError) as info:
        LaplaceMatching(branching).run(jax.random.PRNGKey(0), y=jnp.ones(3))
    assert "jax.lax.cond / jnp.where" in "".join(getattr(info.value, "__notes__", []))


def test_static_where_needed_returns_the_trace_unchanged_when_nothing_is_needed():
    calls = []

    def trace(args, kwargs):
        calls.append(args)
        return "traced"

    args, kwargs, out = static_where_needed(trace, (np.ones(3),), {})
    assert out == "traced" and len(calls) == 1 and not isinstance(args[0], StaticArray)


def test_run_many_refuses_a_model_that_needs_its_data_concretely():
    group, y = data()
    groups, ys = np.stack([group, group]), np.stack([y, y + 1.0])
    with pytest.raises(ValueError, match="run_many traces every data argument.*call run\\(\\) per data set"):
        LaplaceMatching(grouped, progress_bar=False).run_many(jax.random.PRNGKey(0), groups, y=ys)


@pytest.mark.slow
def test_a_sparse_car_priors_adjacency_stays_static():
    """numpyro's CAR(..., is_sparse=True) asks for its adjacency as a NumPy array (a ValueError
    without the word Tracer): the argument is kept static (it raised before), and the counts refit."""
    adj = np.eye(6, k=1) + np.eye(6, k=-1)

    def car(adj, y=None):
        phi = numpyro.sample("phi", dist.CAR(0.0, 0.5, 2.0, adj, is_sparse=True))
        numpyro.sample("y", dist.Poisson(jnp.exp(phi)), obs=y)

    y = np.array([1.0, 0.0, 2.0, 3.0, 1.0, 0.0], np.float32)
    lm = LaplaceMatching(car, strategy="laplace", progress_bar=False)
    lm.run(jax.random.PRNGKey(0), adj, y=y)
    assert np.all(np.isfinite(np.asarray(lm.posterior["phi"].mean)))
    lm.run(jax.random.PRNGKey(1), adj, y=y[::-1].copy())  # new counts, the same adjacency
    assert np.all(np.isfinite(np.asarray(lm.posterior["phi"].mean)))


def test_a_static_argument_is_a_frozen_copy_whose_key_is_computed_once(monkeypatch):
    """mark_static copies the caller's array read-only (changing it after the fit changes
    nothing), its key is hashed once (a nested fit looks its program up per batch of inner fits:
    a 2500 x 2500 adjacency took 27 ms a lookup), and a fresh object keeps the key."""
    import hashlib

    user = np.arange(12.0).reshape(3, 4)
    (static,), _ = mark_static((user,), {}, {0})
    user[0, 0] = 99.0
    assert static[0, 0] == 0.0 and not static.flags.writeable
    calls = []
    digest = hashlib.blake2b
    monkeypatch.setattr(hashlib, "blake2b", lambda *a, **k: calls.append(1) or digest(*a, **k))
    key = static.content_key()
    assert static.content_key() == key and static.fresh().content_key() == key and len(calls) == 1
    assert static.fresh() is not static
    assert np.arange(12.0).reshape(3, 4).view(StaticArray).content_key() == key  # by content

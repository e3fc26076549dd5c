"""plot_marginals: one panel per coordinate, two posteriors, the matched curve."""

import arviz as az
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy import stats

from numpyro_lm import LaplaceMatching
from numpyro_lm.plotting import plot_marginals
from numpyro_lm.plotting import coordinate_density

matplotlib.use("Agg")


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_coordinate_density_of_batched_and_dirichlet_sites():
    grid = jnp.linspace(0.05, 0.95, 7)
    gamma = dist.Gamma(jnp.array([2.0, 5.0]), jnp.array([1.0, 3.0]))
    np.testing.assert_allclose(coordinate_density(gamma, (1,), grid), stats.gamma(5.0, scale=1 / 3.0).pdf(grid), rtol=1e-4)
    dirichlet = dist.Dirichlet(jnp.array([2.0, 3.0, 4.0]))
    # marginal of coordinate 1: Beta(3, 2 + 4)
    np.testing.assert_allclose(coordinate_density(dirichlet, (1,), grid), stats.beta(3.0, 6.0).pdf(grid), rtol=1e-4)
    assert coordinate_density(dist.MultivariateNormal(jnp.zeros(2), jnp.eye(2)), (0,), grid) is None


def model(counts, total):
    rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(3)))
    numpyro.sample("n", dist.Poisson(rate), obs=total)
    numpyro.sample("c", dist.Multinomial(total, w), obs=counts)


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_plot_marginals_overlays_two_posteriors(tmp_path):
    counts = jnp.array([2.0, 3.0, 5.0])
    lm = LaplaceMatching(model, num_samples=500).run(jax.random.PRNGKey(0), counts, 10)
    # the exact posterior as the second InferenceData: Gamma(2 + 10, 2), Dirichlet(3, 4, 6)
    rng = np.random.default_rng(0)
    exact = az.from_dict(posterior={
        "rate": rng.gamma(12.0, 0.5, (1, 500)),
        "w": rng.dirichlet([3.0, 4.0, 6.0], (1, 500)),
    })
    path = tmp_path / "marginals.png"
    fig = plot_marginals(lm, exact, labels=("LM", "exact"), path=str(path))
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["rate", "w[0]", "w[1]", "w[2]"]
    assert all(len(ax.lines) == 1 for ax in visible)  # the matched density of every coordinate
    assert path.stat().st_size > 0


def test_plot_marginals_refuses_other_objects():
    with pytest.raises(TypeError, match="InferenceData"):
        plot_marginals({"x": np.zeros(3)})

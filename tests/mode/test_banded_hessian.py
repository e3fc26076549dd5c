"""The banded Hessian strategy: its band from coloured products, the half-width found from the model,
and Newton on it against the dense strategy, on latent AR trends written with ``scan``."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.contrib.control_flow import scan

from numpyro_lm.core.model import model_info
from numpyro_lm.core.trace import site_values
from numpyro_lm.mode.banded_hessian import (BandedHessian, band_from_products, band_matvec, band_offsets,
                                            cyclic_colours, find_half_width)
from numpyro_lm.mode.derivatives import value_grad_hessian
from numpyro_lm.mode.newton import newton, newton_init

pytestmark = pytest.mark.usefixtures("x64")


def ar_counts(y, order=1):
    """Poisson counts on a latent AR(order) trend, the trend written with ``scan``."""
    mu = numpyro.sample("mu", dist.Normal(1.0, 1.0))
    rho = numpyro.sample("rho", dist.Uniform(-0.9, 0.9).expand([order]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))

    def step(carry, _):
        f = numpyro.sample("f", dist.Normal(jnp.dot(rho, carry), sigma))
        return jnp.concatenate([f[None], carry[:-1]]), f

    _, f = scan(step, jnp.zeros(order), None, length=y.shape[0])
    numpyro.sample("y", dist.Poisson(jnp.exp(mu + f)), obs=y)


def _field_density(order, n=60, seed=0, border=False):
    """The trend's conditional log density at fixed hyperparameters (``border``: the intercept
    ``mu`` left beside the trend, the first coordinate; else among the hyperparameters)."""
    rng = np.random.default_rng(seed)
    y = rng.poisson(3.0, n).astype(np.float64)
    info = model_info(ar_counts, (y, order))
    hyper = [info.layout.site("rho").offset + k for k in range(order)] + [info.layout.site("sigma").offset]
    values = [0.5 / order] * order + [np.log(0.4)]
    if not border:
        hyper, values = [info.layout.site("mu").offset] + hyper, [1.0] + values
    hyper, theta = np.array(hyper), jnp.asarray(values)

    def neg(x):
        return -info.log_density(site_values(info.layout, hyper, theta, x), (y, order))

    x = jnp.asarray(rng.normal(size=n + border) * 0.3)
    return neg, x


# slow (CI=true, make test-all): make test's 5 minutes from a fresh clone; the grid's width 5 below
# keeps the half-width's search and the band's products in the default set
@pytest.mark.parametrize("order", [pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow),
                                   pytest.param(3, marks=pytest.mark.slow)])
def test_the_half_width_is_found_from_the_model_and_the_band_is_the_hessians(order):
    """An AR(p) trend's Hessian is banded with half-width p: the search starts from the reach of
    a few of its columns, p, which holds (the doubling alone would stop at 4 for p = 3), and the
    band read from 2w + 1 products is the dense Hessian's."""
    neg, x = _field_density(order)
    w = find_half_width(neg, x)
    assert w == order
    _, _, (band, _, _), error = BandedHessian(w).evaluate(neg, x)
    assert float(error) < 1e-12
    h = np.asarray(value_grad_hessian(neg, x)[2])
    assert np.all(np.abs(np.triu(h, order + 1)) < 1e-12)  # the model's band
    v = np.random.default_rng(2).normal(size=x.shape[0])
    np.testing.assert_allclose(band_matvec(band, jnp.asarray(v)), h @ v, rtol=1e-10, atol=1e-10)
    if order > 1:  # a band too narrow fails its probe
        assert float(BandedHessian(order - 1).evaluate(neg, x)[3]) > 1e-3


@pytest.mark.parametrize("width", [5, pytest.param(12, marks=pytest.mark.slow)])
def test_a_grid_fields_half_width_is_its_rows_length(width):
    """A Gaussian Markov field over a width x 6 grid numbered row by row (a CAR prior's
    precision: each node's four neighbours) under Poisson counts: the half-bandwidth is the
    row's length, found from the columns' reach in one probe, past the doubling's 1, 2, 4, 8."""
    k = np.arange(width * 6).reshape(6, width)
    adj = np.zeros((k.size, k.size))
    adj[k[:, :-1].ravel(), k[:, 1:].ravel()] = adj[k[:-1].ravel(), k[1:].ravel()] = 1.0
    adj = adj + adj.T
    precision = jnp.asarray(np.diag(adj.sum(1)) - 0.9 * adj)
    y = jnp.asarray(np.random.default_rng(0).poisson(2.0, k.size), jnp.float64)

    def neg(x):
        return 0.5 * x @ precision @ x - jnp.sum(y * x - jnp.exp(x))

    x = jnp.zeros(k.size)
    assert find_half_width(neg, x) == width
    h = np.asarray(value_grad_hessian(neg, x)[2])
    _, _, (band, _, _), error = BandedHessian(width).evaluate(neg, x)
    assert float(error) < 1e-12
    v = np.random.default_rng(1).normal(size=k.size)
    np.testing.assert_allclose(band_matvec(band, jnp.asarray(v)), h @ v, rtol=1e-10, atol=1e-10)
    # inside the band only the diagonals of a left and an upper neighbour hold entries: read
    # with cyclic_colours' fewer probes, the same band
    assert band_offsets(np.asarray(band), 1e-12) == (0, 1, width)
    sparse = BandedHessian(width, offsets=(0, 1, width))
    assert sparse.colours < 2 * width + 1
    _, _, (sparse_band, _, _), error = sparse.evaluate(neg, x)
    assert float(error) < 1e-12
    np.testing.assert_allclose(sparse_band, band, rtol=1e-12, atol=1e-12)


# the grid of a CAR field over 50 x 50 regions; a band with every second diagonal; one diagonal
# beyond the next; the full band (no offsets)
@pytest.mark.parametrize("width, offsets, colours", [(50, (0, 1, 50), 6), (6, (0, 2, 4, 6), 7), (7, (0, 3, 7), 8),
                                                     (4, (), 9)])
def test_cyclic_colours_read_every_entry_of_a_sparse_band_and_one_colour_fewer_does_not(width, offsets, colours):
    """A random symmetric matrix with nonzeros on the diagonals ``offsets`` alone: the products
    with the probes of ``j mod m`` give its band exactly, and with ``m - 1`` colours some entry
    takes another column's value (``m`` is the fewest cyclic colours)."""
    n = 3 * width + 7
    rng = np.random.default_rng(width)
    h = np.zeros((n, n))
    for k in offsets or range(width + 1):
        values = rng.normal(size=n - k) + (5.0 if k == 0 else 0.0)
        h += np.diag(values, -k) + (np.diag(values, k) if k else 0.0)
    truth = np.zeros((n, width + 1))
    for k in range(width + 1):
        truth[k:, k] = np.diagonal(h, -k)
    assert cyclic_colours(width, offsets) == colours

    def read(m):
        probes = np.zeros((m, n))
        probes[np.arange(n) % m, np.arange(n)] = 1.0
        return np.asarray(band_from_products(jnp.asarray(probes @ h), width, offsets)) if m == colours else probes @ h

    np.testing.assert_allclose(read(colours), truth, rtol=1e-12, atol=1e-12)
    # m - 1 colours: read as band_from_products would, some entry is another column's sum
    m, rows = colours - 1, np.arange(n)[:, None]
    columns = rows - np.arange(width + 1)[None, :]
    kept = (columns >= 0) & (np.isin(np.arange(width + 1), offsets)[None, :] if offsets else True)
    fewer = np.where(kept, read(m)[np.mod(columns, m), np.broadcast_to(rows, columns.shape)], 0.0)
    assert not np.allclose(fewer, truth)


def test_a_hessian_that_is_not_banded_is_refused():
    """Every coordinate coupled to every other (a sum inside a square): no band holds."""
    def neg(x):
        return 0.5 * jnp.sum(x**2) + 0.5 * jnp.sum(x) ** 2

    assert find_half_width(neg, jnp.linspace(-1.0, 1.0, 40)) is None


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all (the border test runs Newton by default)
@pytest.mark.parametrize("order", [1, 2])
def test_newton_on_the_band_finds_the_dense_strategys_mode_and_curvature(order):
    neg, x = _field_density(order, seed=1)
    w = find_half_width(neg, x)
    banded = BandedHessian(w)
    state = newton(neg, newton_init(jnp.zeros_like(x), banded), 1e-10, 100, banded)
    dense = newton(neg, newton_init(jnp.zeros_like(x)), 1e-10, 100)
    assert bool(state.converged) and bool(dense.converged)
    np.testing.assert_allclose(state.x, dense.x, atol=1e-8)
    curvature = banded.curvature(state.hess)
    h = np.asarray(value_grad_hessian(neg, state.x)[2])
    np.testing.assert_allclose(curvature.logdet(), np.linalg.slogdet(h)[1], rtol=1e-10)
    np.testing.assert_allclose(curvature.variance(), np.diag(np.linalg.inv(h)), rtol=1e-8)


@pytest.mark.slow  # 18 s (a nested fit): CI=true and make test-all; the bordered band's algebra is in the fast set
def test_a_band_beside_an_intercept_gets_a_dense_border():
    """The intercept among the field's coordinates couples to every step: no band holds alone,
    the band with the intercept as its border does, and Newton on it reaches the dense mode."""
    neg, x = _field_density(1, seed=2, border=True)
    assert find_half_width(neg, x) is None
    assert find_half_width(neg, x, glob=(0,)) == 1
    banded = BandedHessian(1, (0,))
    state = newton(neg, newton_init(jnp.zeros_like(x), banded), 1e-10, 100, banded)
    dense = newton(neg, newton_init(jnp.zeros_like(x)), 1e-10, 100)
    assert bool(state.converged) and float(state.structure_error) < 1e-10
    np.testing.assert_allclose(state.x, dense.x, atol=1e-8)
    h = np.asarray(value_grad_hessian(neg, state.x)[2])
    curvature = banded.curvature(state.hess)
    np.testing.assert_allclose(curvature.logdet(), np.linalg.slogdet(h)[1], rtol=1e-10)
    np.testing.assert_allclose(curvature.variance(), np.diag(np.linalg.inv(h)), rtol=1e-8)

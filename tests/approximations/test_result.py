"""How many draws the verdict weighs: fewer where one evaluation of the model is large."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_lm.core.model import model_info
from numpyro_lm.approximations.result import WORK_BUDGET, Result, diagnostic_samples
from shared_models import whitened_gp


def test_diagnostic_draws_count_the_kernel_matrix():
    # n = 1000: the density computes 10^6-number kernel matrices at each draw, far more than its
    # 2002 latent and 1000 observed numbers: 400 draws (WORK_BUDGET / 10^6), not 4000
    n = 1000
    x, y = jnp.linspace(-3, 3, n), jnp.zeros(n)
    info = model_info(whitened_gp, (x, y))
    result = Result(info, (x, y), {}, jax.random.PRNGKey(0), 1000, None)
    assert result.num_diagnostic_samples == diagnostic_samples(1000, info.size, 1, n * n) == WORK_BUDGET // (n * n)
    small_info = model_info(whitened_gp, (x[:50], y[:50]))
    small = Result(small_info, (x[:50], y[:50]), {}, jax.random.PRNGKey(0), 1000, None)
    assert small.num_diagnostic_samples == 4000


@pytest.mark.parametrize("on_cpu", [True, False])
def test_first_rows_of_draws_equal_their_slice(monkeypatch, on_cpu):
    """The verdict's draws are the first rows of get_samples' (NumPy views on a CPU, a compiled
    slice on an accelerator): both equal the slice."""
    from numpyro_lm.approximations import result as result_module

    monkeypatch.setattr(result_module, "_on_cpu", lambda x: on_cpu)
    tree = ({"a": jnp.arange(12.0).reshape(6, 2), "b": jnp.arange(6)}, jnp.ones((6, 3)))
    out = result_module.first_rows(tree, 4)
    for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(tree)):
        np.testing.assert_array_equal(got, np.asarray(want)[:4])

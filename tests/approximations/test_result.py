"""How many draws the verdict weighs: fewer where one evaluation of the model is large."""

import jax
import jax.numpy as jnp

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

"""compare: one table and the InferenceData of each method on the same model."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_lm.compare import compare


def gamma_poisson(y):
    rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
    numpyro.sample("y", dist.Poisson(rate), obs=y)


@pytest.mark.slow  # 8 s on one core: runs where CI=true (Makefile)
def test_compare_lm_nuts_ess(x64):  # exactness (k-hat -inf) is a float64 property
    y = jnp.array([3.0, 5.0, 4.0, 6.0])
    out = compare(gamma_poisson, y, methods=("lm", "nuts", "ess"), num_warmup=200, num_samples=500,
                  reference="nuts")
    table = out.table
    assert list(table.index) == ["lm", "nuts", "ess"] and set(out.inference_data) == {"lm", "nuts", "ess"}
    assert table.loc["nuts", "x_faster_than_nuts"] == 1.0 and table.loc["nuts", "max_mean_error_sd"] == 0.0
    assert bool(table.loc["nuts", "reference"])
    # LM is the exact posterior (Gamma(20, 5)); NUTS's mean has ~0.05 SD of MC error
    assert table.loc["lm", "max_mean_error_sd"] < 0.25 and table.loc["lm", "pareto_k"] == -np.inf
    assert table.loc["ess", "max_mean_error_sd"] < 0.3
    assert out.inference_data["lm"].posterior["rate"].shape == (4, 125)  # 500 draws as four pseudo-chains


def test_compare_refuses_unknown_methods():
    with pytest.raises(ValueError, match="unknown methods"):
        compare(gamma_poisson, jnp.ones(3), methods=("lm", "vi"))

"""
Many data sets at once, and can LM be trusted on this model? ``run_many`` and ``sbc``.
======================================================================================

1. A bootstrap of the eight schools data: 500 resampled data sets fitted with one
   ``run_many`` call; the spread of the matched posterior mean of ``mu`` over them.
2. Simulation-based calibration (``numpyro_lm.sbc``) of the same model: the joint Laplace
   fit of the group scale ``tau`` is miscalibrated (its ranks pile up), ``mu`` is fine;
   and of a conjugate Gamma-Poisson model, where LM is exact and the ranks are uniform.

Run with ``python examples/calibration.py``; the rank plots are saved to
``examples/output/calibration_*.png``.
"""

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

# sphinx-gallery runs an example from its own folder and sets no __file__
HERE = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else os.getcwd()
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
from models import eight_schools  # noqa: E402

from numpyro_lm import LaplaceMatching, sbc  # noqa: E402

OUTPUT = os.path.join(HERE, "output")


def gamma_poisson(y):
    rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
    with numpyro.plate("days", y.shape[0]):
        numpyro.sample("y", dist.Poisson(rate), obs=y)


def main():
    import matplotlib

    matplotlib.use("Agg")
    os.makedirs(OUTPUT, exist_ok=True)
    model, (sigma,), kwargs = eight_schools()
    y = np.asarray(kwargs["y"])

    # 1. bootstrap: resample the schools (and their standard errors) 500 times
    index = np.random.default_rng(0).integers(0, 8, (500, 8))
    t0 = time.perf_counter()
    lm = LaplaceMatching(model, num_samples=200, progress_bar=False)
    lm.run_many(jax.random.PRNGKey(0), jnp.asarray(np.asarray(sigma)[index]), y=jnp.asarray(y[index]))
    mu = np.asarray(lm.posterior["mu"].mean)
    print(f"bootstrap: {lm.batch_size} fits in {time.perf_counter() - t0:.1f} s (compilation included); "
          f"posterior mean of mu {mu.mean():.2f}, bootstrap SD {mu.std():.2f}")

    # 2. simulation-based calibration
    for name, fit_model, args, kw in (("eight_schools", model, (sigma,), kwargs),
                                       ("gamma_poisson", gamma_poisson, (jnp.ones(10),), {})):
        t0 = time.perf_counter()
        result = sbc(fit_model, *args, num_datasets=300, rng_key=jax.random.PRNGKey(1), **kw)
        print(f"\n{name} ({time.perf_counter() - t0:.1f} s):\n{result}")
        path = os.path.join(OUTPUT, f"calibration_{name}.png")
        result.plot().savefig(path, dpi=80)
        print(f"saved {path}")


if __name__ == "__main__":
    main()

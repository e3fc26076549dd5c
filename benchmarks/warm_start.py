"""Warm-started NUTS (from LM) against cold NUTS: bulk ESS per second of wall time.

For each model, side by side in one process:
- cold: NUTS with 1000 warmup steps from NumPyro's default start (``init_to_uniform``,
  identity mass matrix, diagonal adaptation);
- warm: an LM fit, then NUTS with ``num_warmup`` steps (150 by default) started at the LM
  mode with the LM covariance as its (dense) inverse mass matrix (``warm_nuts``).
Both draw 1000 samples per chain, 2 chains run one after the other. The score is the bulk
ESS (ArviZ) of the *slowest* coordinate divided by the total wall time (compilation,
warmup and, for warm, the LM fit included); R-hat is the worst coordinate's. Each is run
twice: the first call pays XLA compilation (seconds, the same order for both), the
second, with another seed, reuses the compiled code and shows the sampling cost alone.
Run with ``python benchmarks/warm_start.py [model ...]``.
"""

import os
import sys
import time
import warnings

import arviz as az
import jax
import numpy as np
from numpyro.infer import MCMC, NUTS

sys.path.insert(0, os.path.dirname(__file__))
from models import MODELS  # noqa: E402
from report import write_results  # noqa: E402

from numpyro_lm import LaplaceMatching  # noqa: E402
from numpyro_lm.samplers import warm_nuts  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)


def score(mcmc, seconds):
    idata = az.from_numpyro(mcmc, log_likelihood=False)
    ess = az.ess(idata, method="bulk")
    rhat = az.rhat(idata)
    worst_ess = min(float(np.min(ess[v].values)) for v in ess.data_vars)
    worst_rhat = max(float(np.max(rhat[v].values)) for v in rhat.data_vars)
    return {"seconds": seconds, "ess": worst_ess, "ess_per_s": worst_ess / seconds, "rhat": worst_rhat}


def bench(name, num_warmup=150, num_chains=2, seed=0, **warm_kwargs):
    model, args, kwargs = MODELS[name]()
    options = dict(num_samples=1000, num_chains=num_chains, chain_method="sequential", progress_bar=False)

    cold = MCMC(NUTS(model), num_warmup=1000, jit_model_args=True, **options)
    lm = LaplaceMatching(model, progress_bar=False)
    out = {"model": name}
    for run, key in (("first", seed), ("compiled", seed + 1)):
        t0 = time.perf_counter()
        cold.run(jax.random.PRNGKey(key), *args, **kwargs)
        jax.block_until_ready(cold.get_samples())
        cold_score = score(cold, time.perf_counter() - t0)

        t0 = time.perf_counter()
        lm.run(jax.random.PRNGKey(key), *args, **kwargs)
        if run == "first":
            warm = warm_nuts(lm, **warm_kwargs)
            mcmc = MCMC(warm.kernel, num_warmup=num_warmup, jit_model_args=True, **options)
        else:  # same kernel and compiled code, started from the new fit
            warm = warm_nuts(lm, **warm_kwargs)
            mcmc.sampler._inverse_mass_matrix = dict(warm.inverse_mass_matrix)
        init = {k: np.broadcast_to(v, (num_chains,) + v.shape) for k, v in warm.init_params.items()}
        mcmc.run(jax.random.PRNGKey(key), *args, init_params=init, **kwargs)
        jax.block_until_ready(mcmc.get_samples())
        warm_score = score(mcmc, time.perf_counter() - t0)
        out[run] = {"cold": cold_score, "warm": warm_score,
                    "ratio": warm_score["ess_per_s"] / cold_score["ess_per_s"]}
    out["k_hat"] = lm.diagnostics()["pareto_k"]
    return out


def warm_up_jax():
    """A throwaway NUTS run, so that neither side pays JAX's one-off start-up costs."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    def toy():
        numpyro.sample("x", dist.Normal(jnp.zeros(2), 1.0).to_event(1))

    MCMC(NUTS(toy), num_warmup=10, num_samples=10, progress_bar=False).run(jax.random.PRNGKey(0))


def main(names):
    warm_up_jax()
    lines = ["| model | LM k-hat | cold s | cold min ESS | cold ESS/s | cold R-hat | warm s | warm min ESS | "
             "warm ESS/s | warm R-hat | ESS/s ratio |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines))
    for name in names:
        r = bench(name)
        for run in ("first", "compiled"):
            c, w = r[run]["cold"], r[run]["warm"]
            lines.append(f"| {name} ({run}) | {r['k_hat']:.2f} | {c['seconds']:.1f} | {c['ess']:.0f} | "
                         f"{c['ess_per_s']:.1f} | {c['rhat']:.3f} | {w['seconds']:.1f} | {w['ess']:.0f} | "
                         f"{w['ess_per_s']:.1f} | {w['rhat']:.3f} | {r[run]['ratio']:.1f} |")
            print(lines[-1], flush=True)
    if set(names) == set(MODELS):  # a partial run leaves the page's table as it is
        write_results("warm_start", "\n".join(lines), "samplers.md")


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODELS))

"""Reference posteriors of the suite (``benchmarks/suite.py``): long NUTS runs, cached.

``python benchmarks/reference.py [name ...]`` runs, per model, NUTS with 4 chains of 2000
warmup + 5000 draws (sequential, fixed seed), checks the worst bulk ESS (> 2000) and the
worst rank-normalised R-hat (< 1.01) over the latent coordinates (ArviZ), thins to 4000
draws (1000 a chain, chains kept in order) and saves ``benchmarks/references/<name>.npz``:
the constrained latent sites as float32, plus ``__ess__``, ``__rhat__``,
``__num_divergences__``, ``__dim__``, ``__seed__``, ``__numpyro__`` and ``__jax__``.

Where the model as written is pathological for NUTS (a funnel it cannot cross), NUTS
samples the *same posterior* in another parameterisation (``numpyro.handlers.reparam``),
and the original sites are read back as deterministic sites; see ``SETTINGS``.
``load_reference(name)`` reads the cache, ``reference_metadata(name)`` its numbers.
"""

import os
import sys
import time

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.handlers import reparam
from numpyro.infer import MCMC, NUTS
from numpyro.infer.reparam import LocScaleReparam, Reparam
from numpyro.infer.util import initialize_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from suite import SUITE  # noqa: E402

REFERENCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "references")
SEED = 0
NUM_CHAINS, NUM_WARMUP, NUM_SAMPLES, NUM_DRAWS = 4, 2000, 5000, 4000
MIN_ESS, MAX_RHAT = 2000, 1.01


class WhitenReparam(Reparam):
    """``f ~ MultivariateNormal(loc, L L^T)`` as ``f = loc + L z``, ``z ~ Normal(0, 1)``: the same
    distribution, without the funnel between f and the covariance's hyperparameters."""

    def __call__(self, name, fn, obs):
        assert obs is None and isinstance(fn, dist.MultivariateNormal) and fn.batch_shape == ()
        z = numpyro.sample(f"{name}_white", dist.Normal(0.0, 1.0).expand(fn.event_shape).to_event(1))
        return None, fn.loc + fn.scale_tril @ z


# NUTS options and reparameterisations where the defaults fail (each says so in its docstring)
SETTINGS = {
    "eight_schools_centered": {"reparam": {"theta": LocScaleReparam(centered=0.0)}, "target_accept_prob": 0.95},
    "eight_schools_noncentered": {"target_accept_prob": 0.95},
    "eight_schools_noncentered_expand": {"target_accept_prob": 0.95},
    "gp_classification_hyper": {"reparam": {"f": WhitenReparam()}, "target_accept_prob": 0.95},
    "gp_poisson_hyper": {"reparam": {"f": WhitenReparam()}, "dense_mass": True, "target_accept_prob": 0.99},
}


def latent_sites(model, args, kwargs) -> tuple:
    """The model's latent sample sites (not observed, not deterministic, not factors) and its
    number of unconstrained coordinates, from NumPyro's own initialisation (which also
    handles ``ImproperUniform`` sites, which cannot be sampled)."""
    info = initialize_model(jax.random.PRNGKey(0), model, model_args=args, model_kwargs=kwargs)
    names = [k for k, s in info.model_trace.items() if s["type"] == "sample" and not s["is_observed"]]
    return names, int(sum(np.size(v) for v in info.param_info.z.values()))


def worst_ess_rhat(draws: dict) -> tuple:
    """Worst bulk ESS and R-hat over all coordinates with spread (``draws``: (chain, draw, ...))."""
    flat = {k: v.reshape(v.shape[0], v.shape[1], -1) for k, v in draws.items()}
    flat = {k: v[:, :, np.std(v, axis=(0, 1)) > 0] for k, v in flat.items()}  # e.g. L[0, 0] == 1
    import arviz as az  # here: the GPU machine's python has no arviz, and inla.py needs none

    data = az.convert_to_dataset({k: v for k, v in flat.items() if v.shape[-1]})
    ess = min(float(np.min(a)) for a in az.ess(data, method="bulk").data_vars.values())
    rhat = max(float(np.max(a)) for a in az.rhat(data).data_vars.values())
    return ess, rhat


def run_reference(name: str) -> dict:
    """The long NUTS run of suite model ``name``; saves its thinned draws, returns its numbers."""
    model, args, kwargs = SUITE[name]()
    settings = dict(SETTINGS.get(name, {}))
    num_samples = settings.pop("num_samples", NUM_SAMPLES)
    config = settings.pop("reparam", None)
    sampled = reparam(model, config=config) if config else model
    sites, dim = latent_sites(model, args, kwargs)

    start = time.perf_counter()
    mcmc = MCMC(NUTS(sampled, **settings), num_warmup=NUM_WARMUP, num_samples=num_samples, num_chains=NUM_CHAINS,
                chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(SEED), *args, **kwargs)
    samples = mcmc.get_samples(group_by_chain=True)
    seconds = time.perf_counter() - start

    draws = {k: np.asarray(samples[k], np.float64) for k in sites}
    ess, rhat = worst_ess_rhat(draws)
    divergences = int(np.sum(mcmc.get_extra_fields()["diverging"]))
    per_chain = NUM_DRAWS // NUM_CHAINS
    thin = num_samples // per_chain
    kept = {k: v[:, ::thin][:, :per_chain].reshape((NUM_DRAWS,) + v.shape[2:]).astype(np.float32)
            for k, v in draws.items()}
    os.makedirs(REFERENCE_DIR, exist_ok=True)
    np.savez_compressed(os.path.join(REFERENCE_DIR, f"{name}.npz"), **kept, __ess__=ess, __rhat__=rhat,
                        __num_divergences__=divergences, __dim__=dim, __seed__=SEED,
                        __numpyro__=numpyro.__version__, __jax__=jax.__version__)
    return {"name": name, "dim": dim, "seconds": seconds, "ess": ess, "rhat": rhat, "divergences": divergences,
            "ok": ess > MIN_ESS and rhat < MAX_RHAT}


def load_reference(name: str) -> dict:
    """``{site: np.ndarray (4000, ...)}``, the cached reference draws of suite model ``name``."""
    path = os.path.join(REFERENCE_DIR, f"{name}.npz")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no reference for {name!r} at {path}: create it with "
                                f"`python benchmarks/reference.py {name}`")
    with np.load(path) as f:
        return {k: f[k] for k in f.files if not k.startswith("__")}


def reference_metadata(name: str) -> dict:
    """The run's numbers stored beside the draws: ess, rhat, num_divergences, dim, seed, versions."""
    load_reference(name)  # the same error if it is missing
    with np.load(os.path.join(REFERENCE_DIR, f"{name}.npz")) as f:
        return {k.strip("_"): f[k].item() for k in f.files if k.startswith("__")}


def main(names):
    print(f"numpyro {numpyro.__version__}, jax {jax.__version__}, x64={jax.config.jax_enable_x64}, "
          f"{os.cpu_count()} cores; {NUM_CHAINS} chains x ({NUM_WARMUP} + {NUM_SAMPLES}), seed {SEED}")
    print("| model | D | seconds | worst bulk ESS | worst R-hat | divergences | ok |\n|---|---|---|---|---|---|---|")
    for name in names:
        r = run_reference(name)
        print(f"| {name} | {r['dim']} | {r['seconds']:.0f} | {r['ess']:.0f} | {r['rhat']:.4f} | "
              f"{r['divergences']} | {'yes' if r['ok'] else 'NO'} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(SUITE))

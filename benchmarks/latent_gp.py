"""Latent GPs with kernel hyperparameters (issue 24): the default ``LaplaceMatching(model)``
against NUTS, on

- **GP classification, whitened** (the issue's model): ``n`` inputs on [-3, 3], RBF kernel,
  amplitude and lengthscale with LogNormal(0, 1) priors, ``z ~ Normal(0, 1)`` in a plate,
  ``f = cholesky(amp^2 exp(-d^2 / (2 ls^2)) + 1e-3 I) @ z``, ``y ~ Bernoulli(logits=f)``
  (simulated with amp 1.5, ls 0.8), at n = 200 and 1000;
- **Poisson GP regression** (the suite's ``gp_poisson_hyper``: 30 counts, an MVN latent,
  lengthscale and amplitude) against its cached reference (``benchmarks/reference.py``).

Accuracy: W1 / reference SD of the amplitude and the lengthscale (worst of the two), against
long NUTS runs made here and cached (:data:`REFERENCES`: at n = 200 four chains of 1000
warm-up + 2500 draws; at n = 1000 one chain of 400 + 1200, which is what two cores afford).
NUTS itself runs one chain of 1000 + 1000 at n = 200; at n = 1000 (a gradient costs tens of
milliseconds, a transition 30 to 60 of them) it runs 50 warm-up + 50 draws once and its time
for 1000 + 1000 is that run's time per iteration times 2000 (marked *extrapolated*; cold adds
the compilation and the 50 warm-up iterations). Cold: the first call in the process
(compilation included); warm: a second call on the same data with a new key. LM's time
includes ``get_samples()`` (1000 draws: the deterministic ``f`` needs a Cholesky factor per
draw). At n = 1000 the default's inner fits take the numerical low-rank curvature
(``docs/scale.md``). n = 5000 is left out: not measured yet.

``python benchmarks/latent_gp.py`` writes ``benchmarks/results/latent_gp.md`` and the table
in ``docs/gp.md``, making any reference not cached yet (hours at n = 1000);
``--cached-references-only`` leaves those rows' accuracy out ("-", with how far the
reference has come) instead.
"""

import os
import pickle
import sys
import time

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.handlers import reparam
from numpyro.infer import MCMC, NUTS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import REFERENCE_DIR, SETTINGS, load_reference  # noqa: E402
from report import environment, write_results  # noqa: E402
from score import w1_over_sd  # noqa: E402
from suite import SUITE  # noqa: E402

from numpyro_lm import LaplaceMatching  # noqa: E402

NUM_DRAWS = 1000


def gp_data(n, seed=0, amp=1.5, ls=0.8):
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(-3, 3, n)).astype(np.float32)
    k = amp**2 * np.exp(-((x[:, None] - x[None, :]) ** 2) / (2 * ls**2)) + 1e-3 * np.eye(n)
    f = np.linalg.cholesky(k) @ rng.normal(size=n)
    return jnp.asarray(x), jnp.asarray((rng.uniform(size=n) < 1 / (1 + np.exp(-f))).astype(np.float32))


def whitened_gp(x, y=None):
    n = x.shape[0]
    amp = numpyro.sample("amp", dist.LogNormal(0.0, 1.0))
    ls = numpyro.sample("ls", dist.LogNormal(0.0, 1.0))
    k = amp**2 * jnp.exp(-((x[:, None] - x[None, :]) ** 2) / (2 * ls**2)) + 1e-3 * jnp.eye(n)
    with numpyro.plate("n", n):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
    f = numpyro.deterministic("f", jnp.linalg.cholesky(k) @ z)
    with numpyro.plate("obs", n):
        numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)


def _worst(draws, reference, names):
    w1 = w1_over_sd({k: draws[k] for k in names}, {k: reference[k] for k in names})
    return max(float(np.max(v)) for v in w1.values())


def _timed(fn, seeds=(0, 1)):
    out, seconds = None, []
    for seed in seeds:
        start = time.perf_counter()
        out = fn(seed)
        seconds.append(time.perf_counter() - start)
    return out, seconds


def _lm(model, args, kwargs):
    def one(seed):
        lm = LaplaceMatching(model, progress_bar=False).run(jax.random.PRNGKey(seed), *args, **kwargs)
        draws = jax.block_until_ready(lm.get_samples(NUM_DRAWS))
        return lm, {k: np.asarray(v) for k, v in draws.items()}

    (lm, draws), seconds = _timed(one)
    d = lm.diagnostics()
    return draws, seconds, d["trail"][-1]["candidate"] if d.get("trail") else "joint", bool(d["trusted"])


def _nuts(model, args, kwargs, warmup, samples, chains=1, **nuts):
    mcmc = MCMC(NUTS(model, **nuts), num_warmup=warmup, num_samples=samples, num_chains=chains,
                chain_method="sequential", progress_bar=False)

    def one(seed):
        mcmc.run(jax.random.PRNGKey(seed), *args, extra_fields=("diverging",), **kwargs)
        return jax.block_until_ready(mcmc.get_samples(group_by_chain=True))

    draws, seconds = _timed(one)
    return draws, seconds, int(np.sum(mcmc.get_extra_fields()["diverging"]))


REFERENCES = {200: dict(num_chains=4, num_warmup=1000, num_samples=2500, min_ess=1000, max_rhat=1.01),
              1000: dict(num_chains=1, num_warmup=400, num_samples=1200, min_ess=300, max_rhat=1.05)}
"""The long NUTS runs, cached in ``benchmarks/references/latent_gp_{n}.npz``: at n = 1000 a
gradient costs tens of milliseconds here and a transition up to 2^7 of them, so one chain of
400 + 1200 (hours: 9 s an iteration on one core) is what a reference can afford, run in pieces that
survive an interrupted session (:func:`_resumable_chain`); ESS above 300 puts its own W1/sd
noise near 0.06 (R-hat of the split chain)."""

REFERENCE_PIECE = 200
"""Draws per saved piece of a one-chain reference. The partial file is committed (it is a
few tens of kB): a session that ends mid-run hands the chain to the next one, which resumes
it (a fresh checkout has nothing else of the run)."""


def _resumable_chain(path, x, y, num_warmup, num_samples, seed):
    """One NUTS chain in pieces of :data:`REFERENCE_PIECE` draws: after the warm-up and after
    each piece the sampler's state and the draws so far go to ``path + ".partial.pkl"``, and a
    later call goes on from there. Returns ``{"amp", "ls"}`` with a leading chain axis of 1."""
    partial = path + ".partial.pkl"
    mcmc = MCMC(NUTS(whitened_gp, target_accept_prob=0.9), num_warmup=num_warmup, num_samples=REFERENCE_PIECE,
                progress_bar=False)

    def save(state, draws):
        state = jax.tree.map(np.asarray, state)  # waits for the run (JAX dispatches it asynchronously)
        with open(partial + ".tmp", "wb") as f:
            pickle.dump((state, draws), f)
        os.replace(partial + ".tmp", partial)  # whole or not at all, if the session ends meanwhile

    loaded = _load_partial(path)
    if loaded is not None:
        state, draws = jax.tree.map(jnp.asarray, loaded[0]), loaded[1]
    else:
        mcmc.warmup(jax.random.PRNGKey(seed), x, y)
        state, draws = mcmc.post_warmup_state, {"amp": [], "ls": []}
        save(state, draws)
    while REFERENCE_PIECE * len(draws["amp"]) < num_samples:
        mcmc.post_warmup_state = state
        mcmc.run(state.rng_key, x, y)
        samples = mcmc.get_samples()
        for k in draws:
            draws[k].append(np.asarray(samples[k]))
        state = mcmc.last_state
        save(state, draws)
        print(f"reference: {REFERENCE_PIECE * len(draws['amp'])} of {num_samples} draws", flush=True)
    return {k: np.concatenate(v)[None] for k, v in draws.items()}


def _load_partial(path):
    """``(sampler state, draws so far)`` of the reference at ``path``, or None: none yet, or
    cut short by an older version."""
    try:
        with open(path + ".partial.pkl", "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def reference_progress(n) -> str:
    """How far the cached reference at ``n`` is: ``"cached"``, ``"k of N draws"`` or ``"not started"``."""
    path = os.path.join(REFERENCE_DIR, f"latent_gp_{n}.npz")
    if os.path.exists(path):
        return "cached"
    loaded = _load_partial(path)
    if loaded is None:
        return "not started"
    return f"{REFERENCE_PIECE * len(loaded[1]['amp'])} of {REFERENCES[n]['num_samples']} draws"


def reference(n):
    """The long NUTS run at ``n`` (:data:`REFERENCES`), cached; refused below its ESS and R-hat."""
    path = os.path.join(REFERENCE_DIR, f"latent_gp_{n}.npz")
    if os.path.exists(path):
        return dict(np.load(path))
    settings = dict(REFERENCES[n])
    min_ess, max_rhat = settings.pop("min_ess"), settings.pop("max_rhat")
    x, y = gp_data(n)
    if settings["num_chains"] == 1:
        grouped = _resumable_chain(path, x, y, settings["num_warmup"], settings["num_samples"], 2024)
    else:
        mcmc = MCMC(NUTS(whitened_gp, target_accept_prob=0.9), **settings, chain_method="sequential",
                    progress_bar=False)
        mcmc.run(jax.random.PRNGKey(2024), x, y)
        grouped = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    ess = min(float(az.ess(np.asarray(grouped[k]))) for k in ("amp", "ls"))
    # one chain: R-hat between its two halves (ArviZ's needs two chains; it splits each again)
    halves = lambda a: a.reshape(2, -1) if a.shape[0] == 1 else a  # noqa: E731
    rhat = max(float(az.rhat(halves(np.asarray(grouped[k])))) for k in ("amp", "ls"))
    if not (ess > min_ess and rhat < max_rhat):
        raise RuntimeError(f"reference at n = {n}: ESS {ess:.0f}, R-hat {rhat:.3f}")
    out = {k: np.asarray(grouped[k], np.float32).reshape(-1) for k in ("amp", "ls")}
    np.savez(path, **out, __ess__=ess, __rhat__=rhat)
    if os.path.exists(path + ".partial.pkl"):
        os.remove(path + ".partial.pkl")
    return out


def classification_row(n, cached_only=False):
    x, y = gp_data(n)
    lm_draws, lm_s, rung, trusted = _lm(whitened_gp, (x, y), {})
    row = dict(model=f"GP classification, whitened, n = {n}", rung=rung, trusted=trusted, lm_cold=lm_s[0],
               lm_warm=lm_s[1])
    long = REFERENCES.get(n)
    progress = reference_progress(n) if long is not None else "none"
    if long is not None and cached_only and progress != "cached":
        row.update(lm_w1=float("nan"), against=f"- (long NUTS {long['num_chains']} x {long['num_samples']}: "
                                               f"{progress} so far)")
    elif long is not None:
        row.update(lm_w1=_worst(lm_draws, reference(n), ("amp", "ls")),
                   against=f"long NUTS ({long['num_chains']} x {long['num_samples']})")
    if n == 200:
        nuts, nuts_s, div = _nuts(whitened_gp, (x, y), {}, 1000, 1000)
        flat = {k: np.asarray(v).reshape(-1) for k, v in nuts.items() if k in ("amp", "ls")}
        row.update(nuts_w1=_worst(flat, reference(n), ("amp", "ls")), nuts_cold=nuts_s[0], nuts_warm=nuts_s[1],
                   extrapolated=False, divergences=div)
    else:
        mcmc = MCMC(NUTS(whitened_gp), num_warmup=50, num_samples=50, progress_bar=False)
        start = time.perf_counter()
        mcmc.warmup(jax.random.PRNGKey(0), x, y)  # compiles; then time the iterations alone
        jax.block_until_ready(mcmc.last_state)
        compiled = time.perf_counter()
        mcmc.run(mcmc.post_warmup_state.rng_key, x, y)
        jax.block_until_ready(mcmc.get_samples())
        per_iteration = (time.perf_counter() - compiled) / 50
        row.update(nuts_w1=float("nan"), nuts_cold=compiled - start + 2000 * per_iteration,
                   nuts_warm=2000 * per_iteration, extrapolated=True, divergences=0)
        row.setdefault("lm_w1", float("nan"))
        row.setdefault("against", "- (no reference)")
    print(row, flush=True)
    return row


def poisson_row():
    model, args, kwargs = SUITE["gp_poisson_hyper"]()
    reference = load_reference("gp_poisson_hyper")
    names = ("lengthscale", "amplitude")
    lm_draws, lm_s, rung, trusted = _lm(model, args, kwargs)
    settings = dict(SETTINGS["gp_poisson_hyper"])
    nuts_model = reparam(model, config=settings.pop("reparam"))
    nuts, nuts_s, div = _nuts(nuts_model, args, kwargs, 1000, 1000, **settings)
    flat = {k: np.asarray(v).reshape(-1) for k, v in nuts.items() if k in names}
    row = dict(model="Poisson GP regression (suite gp_poisson_hyper), n = 30", rung=rung, trusted=trusted,
               lm_cold=lm_s[0], lm_warm=lm_s[1], lm_w1=_worst(lm_draws, reference, names),
               nuts_w1=_worst(flat, reference, names), nuts_cold=nuts_s[0], nuts_warm=nuts_s[1], extrapolated=False,
               divergences=div, against="suite reference")
    print(row, flush=True)
    return row


def main(cached_only=False):
    rows = [classification_row(200), poisson_row(), classification_row(1000, cached_only)]
    lines = [environment() + f". LM: `LaplaceMatching(model)` (the auto-pilot) and `get_samples({NUM_DRAWS})`; NUTS: "
             "one chain of 1000 warm-up + 1000 draws (`*`: extrapolated from 50 + 50). W1/sd: worst of the two "
             "kernel hyperparameters against the reference named.", "",
             "| model | LM rung | trusted | W1/sd LM | W1/sd NUTS | against | s LM cold | s LM warm | s NUTS cold "
             "| s NUTS warm | NUTS / LM (warm) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        star = "*" if r["extrapolated"] else ""
        nuts_w1 = "-" if np.isnan(r["nuts_w1"]) else f"{r['nuts_w1']:.2f}"
        lm_w1 = "-" if np.isnan(r["lm_w1"]) else f"{r['lm_w1']:.2f}"
        lines.append(f"| {r['model']} | {r['rung']} | {r['trusted']} | {lm_w1} | {nuts_w1} | {r['against']} | "
                     f"{r['lm_cold']:.1f} | {r['lm_warm']:.1f} | {r['nuts_cold']:.0f}{star} | {r['nuts_warm']:.0f}{star} "
                     f"| {r['nuts_warm'] / r['lm_warm']:.1f}x{star} |")
    table = "\n".join(lines)
    print(table)
    write_results("latent_gp", table, "gp.md")


if __name__ == "__main__":
    main(cached_only="--cached-references-only" in sys.argv[1:])

"""Large models: time, peak memory and accuracy of the default ``LaplaceMatching(model)`` as D grows.

Cases (each in a fresh Python process, float32, CPU):

- ``glmm_J``: a logistic GLMM, J groups with a non-centred random intercept
  ``sigma * z_j``, five fixed effects (an intercept and four covariates), 20 observations
  per group (D = J + 6), simulated with sigma 0.7; J = 10^3, 10^4, 10^5;
- ``crossed``: a logistic GLMM with two crossed random intercepts (10^4 levels of the first
  factor, 50 of the second; every observation draws its levels at random);
- ``gp_n``: latent GP classification, whitened (``f = L z``, ``z`` in a plate of n inputs,
  an RBF kernel of fixed amplitude 1.5 and lengthscale 0.8 with jitter 1e-5); n = 500, 2000;
- ``gpmvn_n``: the same GP written as ``f ~ MultivariateNormal(0, K)`` (jitter 1e-3, so
  that K has a float32 Cholesky factor): the library whitens it itself (the ``whiten`` basis);
- ``sparse``: a regression with p = 10^4 coefficients under a heavy-tailed prior (Student-t
  with 3 degrees of freedom and scale 0.1: small coefficients shrink, large ones pass) in a
  plate, n = 200 observations, ten non-zero coefficients. (A horseshoe's local scales,
  ``beta_j ~ Normal(0, tau lam_j)``, have no joint mode: each ``lam_j`` of a zero
  coefficient runs to 0, a funnel per coefficient, which no Laplace approximation serves.)

Per case: the first ``run`` + ``get_samples`` (cold: compilation included) and a second
with another key (warm), the process's peak resident memory after them (``VmHWM``, less
the data's footprint before), the auto-pilot's trail and verdict; where NUTS runs (the
GLMM at J = 10^3 and 10^4: 1 chain, 1000 + 1000 and 500 + 500, seed 1, in the same
process after LM) its cold time and the accuracy of LM against it: the fixed effects' and
sigma's worst ``|mean_LM - mean_NUTS| / sd_NUTS`` against the chain continued to
:data:`REFERENCE_DRAWS` draws (untimed), with the reference mean's Monte Carlo error
``1 / sqrt(ESS)`` (its worst coordinate, in its SDs) and the correlation of the random
effects' posterior means, and NUTS warm-started from LM (``warm_nuts``, 150 + 1000, what
the verdict suggests) with its time and the same gap; at every size the coverage of the simulated random effects by
LM's central 90 % intervals. An error is reported as such (a refused model is a result).

``python benchmarks/scale.py [case ...]`` prints the table; a run over every case writes it to
``benchmarks/results/scale.md`` and ``docs/scale.md`` (on a GPU: over :data:`GPU_CASES`, to
``scale_gpu.md`` and the page's GPU block), with the growth exponents of time
and memory between J = 10^3 and 10^5 fitted on the GLMM rows.
"""

import json
import os
import subprocess
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.diagnostics import effective_sample_size

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import environment, platform, run_table, write_results  # noqa: E402

from numpyro_lm import LaplaceMatching  # noqa: E402

CASES = ["glmm_1000", "glmm_10000", "glmm_100000", "crossed", "gp_500", "gp_2000", "gpmvn_500", "gpmvn_2000",
         "sparse"]
GPU_CASES = ["glmm_1000", "glmm_10000", "glmm_100000"]
"""The cases a run on a GPU takes by default (a lent machine's minutes): the GLMM's three sizes."""
NUTS_RUNS = {"glmm_1000": (1000, 1000), "glmm_10000": (500, 500)}
NUTS_WARM = {"glmm_1000"}
"""Cases where NUTS also runs a second time, compiled (its warm time)."""
REFERENCE_DRAWS = {"glmm_1000": 4000}
"""Draws of the accuracy reference where more than the timed run's (the chain continued)."""


# ------------------------------------------------------------------ models


def glmm(x, group, num_groups, y=None):
    beta = numpyro.sample("beta", dist.Normal(0, 1).expand([x.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("groups", num_groups):
        z = numpyro.sample("z", dist.Normal(0, 1))
    eta = x @ beta + sigma * z[group]
    with numpyro.plate("obs", x.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=eta), obs=y)


def glmm_data(num_groups, per_group=20, seed=0):
    rng = np.random.default_rng(seed)
    n = num_groups * per_group
    x = np.concatenate([np.ones((n, 1)), rng.normal(size=(n, 4))], 1).astype(np.float32)
    group = np.repeat(np.arange(num_groups), per_group).astype(np.int32)
    u = 0.7 * rng.normal(size=num_groups)
    eta = x @ np.array([-0.5, 0.8, -0.4, 0.3, 0.0]) + u[group]
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-eta))).astype(np.float32)
    return (x, group, num_groups), {"y": y}, {"effects": u}


def crossed(x, first, second, sizes, y=None):
    beta = numpyro.sample("beta", dist.Normal(0, 1).expand([x.shape[1]]).to_event(1))
    s1 = numpyro.sample("s1", dist.HalfNormal(1.0))
    s2 = numpyro.sample("s2", dist.HalfNormal(1.0))
    with numpyro.plate("first", sizes[0]):
        a = numpyro.sample("a", dist.Normal(0, 1))
    with numpyro.plate("second", sizes[1]):
        b = numpyro.sample("b", dist.Normal(0, 1))
    eta = x @ beta + s1 * a[first] + s2 * b[second]
    with numpyro.plate("obs", x.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=eta), obs=y)


def crossed_data(sizes=(10_000, 50), per_level=20, seed=0):
    rng = np.random.default_rng(seed)
    n = sizes[0] * per_level
    x = np.concatenate([np.ones((n, 1)), rng.normal(size=(n, 2))], 1).astype(np.float32)
    first = np.repeat(np.arange(sizes[0]), per_level).astype(np.int32)
    second = rng.integers(0, sizes[1], n).astype(np.int32)
    ua, ub = 0.7 * rng.normal(size=sizes[0]), 0.5 * rng.normal(size=sizes[1])
    eta = x @ np.array([-0.3, 0.5, -0.5]) + ua[first] + ub[second]
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-eta))).astype(np.float32)
    return (x, first, second, sizes), {"y": y}, {"effects": ua}


def gp_classification(chol, y=None):
    with numpyro.plate("inputs", chol.shape[0]):
        z = numpyro.sample("z", dist.Normal(0, 1))
    f = numpyro.deterministic("f", chol @ z)
    with numpyro.plate("inputs", chol.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)


def gp_data(n, seed=0):
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(-3, 3, n))
    k = 1.5**2 * np.exp(-0.5 * (t[:, None] - t[None, :]) ** 2 / 0.8**2) + 1e-5 * np.eye(n)
    chol = np.linalg.cholesky(k)
    f = chol @ rng.normal(size=n)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-f))).astype(np.float32)
    return (chol.astype(np.float32),), {"y": y}, {"f": f}


def gp_mvn_classification(cov, y=None):
    """The same GP written with its prior: the library whitens it (the ``whiten`` basis)."""
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(cov.shape[0]), cov))
    numpyro.sample("y", dist.Bernoulli(logits=f).to_event(1), obs=y)


def gp_mvn_data(n, seed=0):
    """:func:`gp_data`'s kernel with jitter 1e-3 (jitter 1e-5 leaves K, condition number
    ~10^9 at n = 2000, without a float32 Cholesky factor: numpyro's MultivariateNormal
    itself cannot be built from it)."""
    (chol,), kwargs, truth = gp_data(n, seed)
    chol = chol.astype(np.float64)
    return ((chol @ chol.T + 1e-3 * np.eye(n)).astype(np.float32),), kwargs, truth


def sparse_regression(x, y=None):
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("coefficients", x.shape[1]):
        beta = numpyro.sample("beta", dist.StudentT(3.0, 0.0, 0.1))
    numpyro.sample("y", dist.Normal(x @ beta, sigma).to_event(1), obs=y)


def sparse_data(p=10_000, n=200, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, p)).astype(np.float32)
    beta = np.zeros(p)
    beta[:10] = rng.normal(size=10) * 2
    y = (x @ beta + 0.5 * rng.normal(size=n)).astype(np.float32)
    return (x,), {"y": y}, {"effects": beta}


def case(name):
    """``(model, args, kwargs, truth)`` of a case."""
    if name.startswith("glmm_"):
        return (glmm, *glmm_data(int(name.split("_")[1])))
    if name.startswith("gp_"):
        return (gp_classification, *gp_data(int(name.split("_")[1])))
    if name.startswith("gpmvn_"):
        return (gp_mvn_classification, *gp_mvn_data(int(name.split("_")[1])))
    if name == "crossed":
        return (crossed, *crossed_data())
    if name == "sparse":
        return (sparse_regression, *sparse_data())
    raise KeyError(name)


# ---------------------------------------------------------------- measures


def peak_gib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def timed(fn):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    return time.perf_counter() - start, out


def effects(name, samples):
    """Draws of the case's random effects (the truth's scale): ``(S, J)``."""
    if name.startswith("glmm_"):
        return np.asarray(samples["sigma"])[:, None] * np.asarray(samples["z"])
    if name == "crossed":
        return np.asarray(samples["s1"])[:, None] * np.asarray(samples["a"])
    if name.startswith(("gp_", "gpmvn_")):
        return np.asarray(samples["f"])
    return np.asarray(samples["beta"])


def coverage(draws, truth, level=0.9) -> float:
    low, high = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return float(np.mean((truth >= low) & (truth <= high)))


def assess(name: str) -> dict:
    model, args, kwargs, truth = case(name)
    base = peak_gib()
    out = {"name": name}
    lm = LaplaceMatching(model, progress_bar=False)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the verdict is reported below
            cold, samples = timed(lambda: lm.run(jax.random.PRNGKey(0), *args, **kwargs).get_samples())
            warm, _ = timed(lambda: lm.run(jax.random.PRNGKey(1), *args, **kwargs).get_samples())
    except Exception as e:  # noqa: BLE001 - a refusal is a result
        out.update(error=f"{type(e).__name__}: {e}", peak=peak_gib() - base)
        return out
    d = lm.diagnostics()
    trail = " -> ".join(f"{a['candidate']} {'ok' if a['trusted'] else 'x'}" for a in d.get("trail") or [])
    truth_key = "f" if "f" in truth else "effects"
    draws = effects(name, samples)
    out.update(dim=int(d["dimension"]), cold=cold, warm=warm, peak=peak_gib() - base, pareto_k=d["pareto_k"],
               trusted=d["trusted"], trail=trail or "-", coverage=coverage(draws, truth[truth_key]))
    if name in NUTS_RUNS:
        from numpyro.infer import MCMC, NUTS

        from numpyro_lm import warm_nuts

        def run_warm():  # what the verdict's hint runs: NUTS from LM's mode and covariance
            warm = warm_nuts(lm)
            mcmc = MCMC(warm.kernel, num_warmup=150, num_samples=1000, progress_bar=False)
            mcmc.run(jax.random.PRNGKey(2), *args, init_params=warm.init_params, **kwargs)
            return mcmc.get_samples()

        warm_time, warm_samples = timed(run_warm)
        warmup, num = NUTS_RUNS[name]
        mcmc = MCMC(NUTS(model), num_warmup=warmup, num_samples=num, progress_bar=False)
        nuts_cold, ref = timed(lambda: (mcmc.run(jax.random.PRNGKey(1), *args, **kwargs), mcmc.get_samples())[1])
        chunks = [ref]
        if name in NUTS_WARM:  # the same run again, compiled: LM's warm column's peer (its draws join the reference)
            out["nuts_warm"], second = timed(lambda: (mcmc.run(jax.random.PRNGKey(4), *args, **kwargs),
                                                      mcmc.get_samples())[1])
            chunks.append(second)
        # the accuracy reference: the same chain continued (untimed) to REFERENCE_DRAWS draws,
        # so that its Monte Carlo error stays below the 0.1 SD the comparison is about
        for _ in range(REFERENCE_DRAWS.get(name, num) // num - len(chunks)):
            mcmc.post_warmup_state = mcmc.last_state
            mcmc.run(mcmc.post_warmup_state.rng_key, *args, **kwargs)
            chunks.append(mcmc.get_samples())
        ref = {k: np.concatenate([np.asarray(c[k]) for c in chunks]) for k in ref}

        def globals_of(draws):
            return np.concatenate([np.asarray(draws["beta"]), np.asarray(draws["sigma"])[:, None]], 1)

        theirs = globals_of(ref)
        # the reference mean's Monte Carlo standard error in its SDs: 1 / sqrt(ESS)
        mc_error = float(np.max(1.0 / np.sqrt(effective_sample_size(theirs[None]))))

        def global_gap(draws):
            return np.abs(globals_of(draws).mean(0) - theirs.mean(0)) / theirs.std(0)

        gap = global_gap(samples)
        out.update(nuts=f"{warmup}+{num}", nuts_cold=nuts_cold, worst_global=float(gap.max()), mc_error=mc_error,
                   reference_draws=len(theirs),
                   warm_time=warm_time, warm_gap=float(global_gap(warm_samples).max()),
                   worst_name=(["beta[%d]" % i for i in range(gap.size - 1)] + ["sigma"])[int(gap.argmax())],
                   effects_corr=float(np.corrcoef(draws.mean(0), effects(name, ref).mean(0))[0, 1]))
    return out


def assess_fresh(name: str) -> dict:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", name], capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"name": name, "error": f"the process failed (exit {out.returncode}): {out.stderr[-500:]}"}
    return json.loads(lines[-1])


def row(r) -> str:
    def f(key, fmt):
        v = r.get(key)
        return "-" if v is None else format(v, fmt)

    if "error" in r:
        why = " ".join(r["error"].replace("|", "/").split())[:300]
        return f"| {r['name']} | - | raised: {why} | - | {f('peak', '.2f')} | - | - | - | - | - | - | - | - | - | - |"
    return (f"| {r['name']} | {r['dim']} | {r['cold']:.1f} | {r['warm']:.1f} | {r['peak']:.2f} | "
            f"{r['pareto_k']:.2f} | {r['trusted']} | {r['trail']} | {r['coverage']:.3f} | "
            f"{f('nuts_cold', '.1f')} | {f('nuts_warm', '.1f')} | "
            + ("-" if "worst_global" not in r else
               f"{r['worst_global']:.2f} ({r['worst_name']}; MC error {r['mc_error']:.2f}, {r['reference_draws']} draws)")
            + " | "
            + f"{f('effects_corr', '.4f')} | {f('warm_time', '.1f')} | {f('warm_gap', '.2f')} |")


def exponents(results) -> list:
    rows = {r["name"]: r for r in results if r["name"].startswith("glmm_") and "error" not in r}
    if not {"glmm_1000", "glmm_100000"} <= set(rows):
        return []
    small, big = rows["glmm_1000"], rows["glmm_100000"]
    ratio = np.log(big["dim"] / small["dim"])
    grow = {k: np.log(big[k] / small[k]) / ratio for k in ("cold", "warm", "peak")}
    return [f"- Growth between J = 10^3 and 10^5 (D {small['dim']} to {big['dim']}), fitted exponent of D: "
            f"cold time {grow['cold']:.2f}, warm time {grow['warm']:.2f}, peak memory {grow['peak']:.2f} "
            "(1 is linear; O(D log D) over this range is about 1.2)."]


def speedups(results) -> list:
    """NUTS time / LM time at J = 10^3, cold and warm (the issue's 20x target)."""
    row = next((r for r in results if r["name"] == "glmm_1000" and "nuts_warm" in r), None)
    if row is None:
        return []
    return [f"- J = 10^3: NUTS / LM time {row['nuts_cold'] / row['cold']:.1f}x cold, "
            f"{row['nuts_warm'] / row['warm']:.1f}x warm."]


def main(names):
    lines = [
        environment() + ". Times in seconds (run + get_samples; cold includes compilation), peak: the process's resident memory "
        "beyond its data, GiB. coverage: the simulated random effects (GP: latent function values) inside "
        "LM's central 90 % intervals. NUTS: 1 chain, warmup + draws (warm: the same run again, compiled); gap: the worst fixed effect or scale, "
        "|mean LM - mean NUTS| / sd NUTS, against the NUTS chain continued to the draws named (the reference's Monte "
        "Carlo error 1 / sqrt(ESS) beside it); corr: of the random effects' posterior means; warm-started NUTS: "
        "warm_nuts(lm) and 150 + 1000 iterations, as the verdict suggests (seconds, compilation included), and "
        "its gap.",
        "",
        "| case | D | LM cold | LM warm | peak GiB | pareto_k | trusted | trail | coverage 90% | NUTS cold | NUTS warm | "
        "gap to NUTS (SD) | corr to NUTS | warm-started NUTS | its gap (SD) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    results = run_table(lines, names, assess_fresh, row)
    tail = speedups(results) + exponents(results)
    if tail:
        lines += [""] + tail
        print("\n" + "\n".join(tail), flush=True)
    if set(names) == set(CASES if platform() == "cpu" else GPU_CASES):
        write_results("scale", "\n".join(lines), "scale.md")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        jax.block_until_ready(jnp.zeros(1) + 1)  # the backend's start-up outside the timings
        print(json.dumps(assess(sys.argv[2]), default=float), flush=True)
    else:
        main(sys.argv[1:] or (CASES if platform() == "cpu" else GPU_CASES))

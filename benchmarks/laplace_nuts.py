"""Laplace-marginal NUTS against NUTS, blackjax's ``laplace_hmc`` and the joint fit, side by
side in one process (issue 23).

Models (``benchmarks/suite.py``, each with its long-NUTS reference in
``benchmarks/references/``): eight schools centred and non-centred, varying intercepts with
unknown group and noise scales, and a latent GP classification whose lengthscale and
amplitude are hyperparameters; and the logistic GLMM of ``benchmarks/scale.py`` (five fixed
effects, a group scale, one random intercept per group, 20 observations a group) with
J = 100 and 1000 groups, whose reference is a NUTS run of 1000 warm-up + 4000 draws made here,
and J = 10 000 (no reference: a long run would take most of an hour here; its rows give time
and ESS per second only, W1 "-") (blackjax's ``laplace_hmc`` forms the dense Hessian of the random effects at every leapfrog
step: it runs at J = 100 only). The split is ``LaplaceNUTS``'s default (sites inside plates
and multivariate-normal latents integrated out; the rest sampled), the same for blackjax.

Methods, each run twice on the same data ("cold": the first call, compilation included;
"warm": the second):

- ``NUTS``: NumPyro NUTS on the model as written, 1 chain, 500 warm-up + 1000 draws (500 on the
  GLMMs, as issue 23 times them);
- ``LaplaceNUTS``: ``MCMC(LaplaceNUTS(model))``, the same numbers;
- ``blackjax``: ``blackjax.laplace_hmc`` (1.7) on the same ``log p(theta, phi)`` (the
  package's LM-basis density), window adaptation over 500 steps, then as many draws of 10
  leapfrog steps; its ``theta`` is not drawn, so only the hyperparameters are scored;
- ``LM``: ``LaplaceMatching(model)`` (the auto-pilot), 1000 draws.

Under the table, for each GLMM: the group scale's posterior mean by each MCMC method and the
reference, and LaplaceNUTS's warm time against NUTS's.

Scores: the worst W1 / reference SD over the hyperparameters' coordinates (constrained), the
same over the latent field where the method draws it, seconds cold and warm, and the
smallest bulk ESS of a hyperparameter coordinate per warm second (MCMC methods).
``python benchmarks/laplace_nuts.py`` writes ``benchmarks/results/laplace_nuts.md`` and the
table in ``docs/samplers.md``.
"""

import os
import sys
import time

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC, NUTS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import load_reference  # noqa: E402
from report import environment, write_results  # noqa: E402
from score import w1_over_sd  # noqa: E402
from scale import glmm, glmm_data  # noqa: E402
from suite import SUITE  # noqa: E402

from numpyro_lm import LaplaceMatching, LaplaceNUTS  # noqa: E402
from numpyro_lm.samplers.tilted_nuts import default_marginalized, joint_vector, split_coordinates  # noqa: E402
from numpyro_lm.core.model import model_info  # noqa: E402

MODELS = ("eight_schools_noncentered", "eight_schools_centered", "hierarchical_normal_groups",
          "gp_classification_hyper", "glmm_100", "glmm_1000", "glmm_10000")
REFERENCE_MAX_GROUPS = 1000  # GLMMs above this many groups are scored without a reference
BLACKJAX_MAX_FIELD = 200  # field coordinates up to which blackjax's dense inner Hessian is run
REFERENCE_WARMUP, REFERENCE_DRAWS = 1000, 4000
NUM_WARMUP, NUM_SAMPLES, LEAPFROG_STEPS = 500, 1000, 10
GLMM_SAMPLES = 500  # the GLMMs: the 1 chain of 500 + 500, NUTS's time against LaplaceNUTS's


def _split_sites(model, args, kwargs):
    info = model_info(model, args, kwargs)
    theta = default_marginalized(info.layout)
    return info, theta, [s.name for s in info.layout.sites if s.name not in theta]


def _scores(draws, reference, hyper, field):
    if reference is None:
        return float("nan"), float("nan")
    w1 = w1_over_sd({k: draws[k] for k in reference if k in draws}, reference)
    worst = lambda names: max((float(np.nanmax(w1[n])) for n in names if n in w1), default=float("nan"))
    return worst(hyper), worst(field)


def _min_ess(draws, hyper):
    ess = [float(az.ess(np.asarray(draws[n]).reshape(1, len(draws[n]), -1)[..., i]))
           for n in hyper for i in range(int(np.prod(np.shape(draws[n])[1:])) or 1)]
    return min(ess)


def _mcmc(kernel, args, kwargs, num_samples, seeds=(0, 1)):
    """``(the last seed's draws, seconds per seed)``."""
    mcmc = MCMC(kernel, num_warmup=NUM_WARMUP, num_samples=num_samples, progress_bar=False)
    seconds = []
    for seed in seeds:
        start = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(seed), *args, **kwargs)
        draws = jax.block_until_ready(mcmc.get_samples())
        seconds.append(time.perf_counter() - start)
    return {k: np.asarray(v) for k, v in draws.items()}, seconds


def _blackjax(info, theta_sites, args, kwargs, num_samples, seeds=(0, 1)):
    """``(the last seed's draws, seconds per seed)``."""
    import blackjax
    from blackjax.mcmc.laplace_marginal import laplace_marginal_factory

    theta_index, phi_index = split_coordinates(info.layout, set(theta_sites))

    def log_joint(theta, phi):
        return info.log_density(joint_vector(theta, phi, theta_index, phi_index, info.size), args, kwargs)

    laplace = laplace_marginal_factory(log_joint, jnp.zeros(len(theta_index)))
    kernel = blackjax.laplace_hmc.build_kernel()
    seconds = []
    for seed in seeds:
        start = time.perf_counter()
        adapt = blackjax.window_adaptation(blackjax.laplace_hmc, laplace, num_integration_steps=LEAPFROG_STEPS)
        (state, params), _ = adapt.run(jax.random.PRNGKey(seed), jnp.zeros(len(phi_index)), num_steps=NUM_WARMUP)

        @jax.jit
        def chain(state, key):
            def body(s, k):
                s, _ = kernel(k, s, laplace, params["step_size"], params["inverse_mass_matrix"], LEAPFROG_STEPS)
                return s, (s.position, s.theta_star)

            return jax.lax.scan(body, state, jax.random.split(key, num_samples))[1]

        phi, theta_star = jax.block_until_ready(chain(state, jax.random.PRNGKey(100 + seed)))
        seconds.append(time.perf_counter() - start)
    flat = jax.vmap(lambda t, p: joint_vector(t, p, theta_index, phi_index, info.size))(theta_star, phi)
    draws = jax.vmap(lambda z: info.constrain(z, args, kwargs))(flat)
    return {k: np.asarray(v) for k, v in draws.items()}, seconds


def _lm(model, args, kwargs):
    seconds = []
    for seed in range(2):
        start = time.perf_counter()
        lm = LaplaceMatching(model, progress_bar=False).run(jax.random.PRNGKey(seed), *args, **kwargs)
        draws = jax.block_until_ready(lm.get_samples())
        seconds.append(time.perf_counter() - start)
    return {k: np.asarray(v) for k, v in draws.items()}, seconds


def _problem(name):
    """``(model, args, kwargs, reference draws)``: a suite model with its cached reference, or
    a GLMM with a reference NUTS run made here."""
    if name in SUITE:
        model, args, kwargs = SUITE[name]()
        return model, args, kwargs, load_reference(name)
    args, kwargs, _ = glmm_data(int(name.split("_")[1]))
    args, kwargs = (jnp.asarray(args[0]), jnp.asarray(args[1]), args[2]), {"y": jnp.asarray(kwargs["y"])}
    if args[2] > REFERENCE_MAX_GROUPS:
        return glmm, args, kwargs, None
    mcmc = MCMC(NUTS(glmm), num_warmup=REFERENCE_WARMUP, num_samples=REFERENCE_DRAWS, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(7), *args, **kwargs)
    return glmm, args, kwargs, {k: np.asarray(v) for k, v in mcmc.get_samples().items()}


def run_model(name):
    model, args, kwargs, reference = _problem(name)
    info, theta, hyper = _split_sites(model, args, kwargs)
    field_size = sum(info.layout.site(n).size for n in theta)
    num_samples = GLMM_SAMPLES if name.startswith("glmm") else NUM_SAMPLES
    rows = []
    for method in ("NUTS", "LaplaceNUTS", "blackjax", "LM"):
        if method == "blackjax" and field_size > BLACKJAX_MAX_FIELD:
            continue
        if method == "NUTS":
            draws, seconds = _mcmc(NUTS(model), args, kwargs, num_samples)
        elif method == "LaplaceNUTS":
            draws, seconds = _mcmc(LaplaceNUTS(model), args, kwargs, num_samples)
        elif method == "blackjax":
            draws, seconds = _blackjax(info, theta, args, kwargs, num_samples)
        else:
            draws, seconds = _lm(model, args, kwargs)
        hyper_w1, field_w1 = _scores(draws, reference, hyper, theta if method != "blackjax" else ())
        ess = _min_ess(draws, hyper) / seconds[1] if method != "LM" else float("nan")
        rows.append(dict(model=name, method=method, hyper=hyper, theta=theta, hyper_w1=hyper_w1, field_w1=field_w1,
                         cold=seconds[0], warm=seconds[1], ess_per_s=ess, scale_mean=_scale_mean(draws, reference)))
        print(rows[-1], flush=True)
    return rows


def _scale_mean(draws, reference):
    """``(mean of sigma, the reference's)`` on a GLMM (nan where absent)."""
    mean = lambda d: float(np.mean(d["sigma"])) if d is not None and "sigma" in d else float("nan")  # noqa: E731
    return mean(draws), mean(reference)


def _glmm_lines(rows):
    """Per GLMM: sigma's posterior mean by method against the reference; LaplaceNUTS's time against NUTS's."""
    lines = []
    for name in dict.fromkeys(r["model"] for r in rows if r["model"].startswith("glmm")):
        by = {r["method"]: r for r in rows if r["model"] == name}
        means = ", ".join(f"{m} {by[m]['scale_mean'][0]:.3f}" for m in ("NUTS", "LaplaceNUTS", "blackjax") if m in by)
        reference = by["NUTS"]["scale_mean"][1]
        against = "" if np.isnan(reference) else f" (reference {reference:.3f})"
        lines.append(f"- {name}: sigma's posterior mean {means}{against}; LaplaceNUTS warm time / NUTS's "
                     f"{by['LaplaceNUTS']['warm'] / by['NUTS']['warm']:.2f}, ESS/s ratio "
                     f"{by['LaplaceNUTS']['ess_per_s'] / by['NUTS']['ess_per_s']:.1f}.")
    return lines


def _seconds(t):
    return f"{t:.1f}" if t >= 1 else f"{t:.3f}"


def main():
    rows = [row for name in MODELS for row in run_model(name)]
    lines = [environment() + f". MCMC methods: 1 chain, {NUM_WARMUP} warm-up + {NUM_SAMPLES} draws "
             f"({GLMM_SAMPLES} on the GLMMs); blackjax "
             f"laplace_hmc {LEAPFROG_STEPS} leapfrog steps after window adaptation; LM: the default call. W1/sd: "
             "worst over coordinates, against the long-NUTS reference; ESS/s: smallest bulk ESS of a hyperparameter "
             "coordinate per warm second.", "",
             "| model (hyperparameters / field) | method | W1/sd hyper | W1/sd field | cold s | warm s | ESS/s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        field = "-" if np.isnan(r["field_w1"]) else f"{r['field_w1']:.2f}"
        hyper = "-" if np.isnan(r["hyper_w1"]) else f"{r['hyper_w1']:.2f}"
        ess = "-" if np.isnan(r["ess_per_s"]) else f"{r['ess_per_s']:.0f}"
        lines.append(f"| {r['model']} ({', '.join(r['hyper'])} / {', '.join(r['theta'])}) | {r['method']} | "
                     f"{hyper} | {field} | {_seconds(r['cold'])} | {_seconds(r['warm'])} | {ess} |")
    table = "\n".join(lines + [""] + _glmm_lines(rows))
    print(table)
    write_results("laplace_nuts", table, "samplers.md")


if __name__ == "__main__":
    main()

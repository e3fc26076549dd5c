"""LM + GP against the full latent GP on the same kernel: accuracy, calibration and time.

The four data kinds of the thesis' chapter 3:

- ``binary``: scikit-learn's breast-cancer data (569 points, 30 standardised features), a
  fixed 400 / 169 split; LM + GP on every training point, and on 50 k-means groups;
- ``counts``: Poisson counts of a generated rate ``exp(1 + sin(2 x) + x / 3)`` at 1000 inputs on
  [-3, 3] (the thesis' toy's spirit), and the true rate at 200 test inputs;
- ``categories``: scikit-learn's iris and wine (standardised, 70 % training) and digits (pixels
  / 16, 200 training images, one shared lengthscale), every training point its own group;
  the full latent GP has LM + GP's prior over the zero-sum logits;
- ``covariances``: 235 months of 21 zero-mean 4-vectors whose covariance drifts (volatilities
  on sines, rotating eigenvectors; the thesis' currency example's shape), one group per month;
  RMSE of the predicted inverse Wishart's mean against the true covariances and the share of
  true entries within 2 SD (the thesis' in2std); the full latent GP is one GP per ``vech``
  coordinate of each month's matrix log with the returns' Gaussian likelihood; also each
  month's own pseudo-observation mapped back to its inverse Wishart (no GP).

Last, LM + GP's scores under each kernel search (the data's leave-one-out predictive, the
pseudo-observations' evidence) and the sensitivity of binary and categorical scores to the
prior weight ``eps``.

For each: LM + GP (``numpyro_lm.contrib.gp.LMGP``: pseudo-observations, kernel hyperparameters,
Newton steps towards the Laplace GP where asked, predictions) with its default options and on
the kernel of the pseudo-observations' evidence without and with Newton steps, timed cold
(compilation included) and warm (a refit); then the full latent GP on that evidence's kernel,
whitened (``f = m + L z``, ``z ~ N(0, I)``), sampled by elliptical slice sampling (the
reference: 1000 + 2000 steps, one chain, its smallest effective sample size reported) and
fitted by ``LaplaceMatching(model).run`` (joint Laplace), both timed the same way, their test
predictions from their draws of ``f`` through the GP conditional. LM + GP is also timed at the
kernel it found (the "solve": what LM + GP adds to one GP regression). Reported: accuracy,
negative log likelihood (NLL) and expected calibration error (ECE, 10 bins) on the test labels
(binary, categories); RMSE of the predicted rate against the truth and the share of true rates
inside the central 95 % interval (counts); RMSE and in2std (covariances); and LM + GP's
speed-up over the joint Laplace GP. ``python benchmarks/lm_gp.py`` writes
``benchmarks/results/lm_gp.md``.
"""

import os
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from scipy import stats

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import environment  # noqa: E402

from numpyro.diagnostics import effective_sample_size  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

from numpyro_lm import EllipticalSlice, LaplaceMatching  # noqa: E402
from numpyro.distributions.transforms import ZeroSumTransform  # noqa: E402

from numpyro_lm.contrib.gp import EPS, LMGP, default_choices, matched_predictive, pseudo_observations, rbf_kernel  # noqa: E402
from numpyro_lm.contrib.gp.blocks import predictive  # noqa: E402
from numpyro_lm.contrib.gp.pseudo import covariance_log_likelihood  # noqa: E402
from numpyro_lm.contrib.gp.refine import relinearise  # noqa: E402
from numpyro_lm.contrib.nn import metrics  # noqa: E402
from numpyro_lm.families.bases import SymmetricMatrixExpTransform  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def timed(fn):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    return time.perf_counter() - start, out


# -------------------------------------------------------------------- data


def breast_cancer(seed=0):
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x = (data.data - data.data.mean(0)) / data.data.std(0)
    order = np.random.default_rng(seed).permutation(len(x))
    train, test = order[:400], order[400:]
    return x[train], data.target[train].astype(float), x[test], data.target[test].astype(float)


def poisson_toy(n=1000, seed=0):
    rng = np.random.default_rng(seed)
    rate = lambda x: np.exp(1.0 + np.sin(2.0 * x) + x / 3.0)  # noqa: E731
    x = np.sort(rng.uniform(-3, 3, n))
    test = np.linspace(-3, 3, 200)
    return x[:, None], rng.poisson(rate(x)).astype(float), test[:, None], rate(test)


def classification(name, seed=0):
    """scikit-learn's iris / wine (standardised, 70 % training) or digits (pixels / 16, 200 training)."""
    from sklearn import datasets

    data = getattr(datasets, f"load_{name}")()
    x = data.data / 16.0 if name == "digits" else (data.data - data.data.mean(0)) / data.data.std(0)
    order = np.random.default_rng(seed).permutation(len(x))
    split = 200 if name == "digits" else int(0.7 * len(x))
    train, test = order[:split], order[split:]
    return x[train], data.target[train], x[test], data.target[test]


def covariance_path(months=235, per_month=21, p=4, seed=0):
    """Zero-mean returns of a covariance that drifts over ``months`` (volatilities on sines, the
    eigenvectors rotating): ``(inputs in years, returns, month labels, test inputs, true covariances)``."""
    rng = np.random.default_rng(seed)
    s = np.arange(months) / months
    vol = 0.5 + 0.3 * np.sin(2 * np.pi * (s[:, None] + np.arange(p) / p))
    mix = np.linalg.qr(np.eye(p) + 0.5 * np.ones((p, p)))[0]
    truth = np.empty((months, p, p))
    for t, angle in enumerate(np.pi * s):
        c, sn = np.cos(angle), np.sin(angle)
        q = np.eye(p)
        q[:2, :2], q[2:, 2:] = [[c, -sn], [sn, c]], [[c, sn], [-sn, c]]
        q = q @ mix
        truth[t] = q @ np.diag(vol[t] ** 2) @ q.T
    chol = np.linalg.cholesky(truth)
    returns = np.einsum("tij,tnj->tni", chol, rng.standard_normal((months, per_month, p))).reshape(-1, p)
    months_in_years = np.arange(months) / 12.0
    return (np.repeat(months_in_years, per_month)[:, None], returns, np.repeat(np.arange(months), per_month),
            months_in_years[:, None], truth)


def kmeans_labels(x, k, seed=0):
    from sklearn.cluster import KMeans

    return KMeans(k, n_init=4, random_state=seed).fit(x).labels_


# -------------------------------------------------------------- the full GP


def latent_gp(chol, mean, link, y=None, scale=None):
    """The whitened latent GP: ``f = mean + L z``, ``y ~ Bernoulli(logits=f)`` or ``Poisson(exp f)``;
    for ``link="softmax"`` LM + GP's prior over the zero-sum logits: ``K - 1`` independent GPs
    ``g = mean + scale * (L z)`` (``z`` is ``(n, K - 1)``) in ``ZeroSumTransform``'s orthonormal
    coordinates, ``f`` their lift to ``K`` zero-sum logits and ``y ~ Categorical(logits=f)``."""
    n = chol.shape[0]
    if link == "expm":  # covariances: one GP per vech coordinate of logm(Sigma), y = (counts, scatters)
        with numpyro.plate("coordinates", mean.shape[-1], dim=-1), numpyro.plate("inputs", n, dim=-2):
            z = numpyro.sample("z", dist.Normal(0.0, 1.0))
        g = numpyro.deterministic("f", mean + scale * (chol @ z))
        numpyro.factor("y", jnp.sum(jax.vmap(covariance_log_likelihood)(y[0], y[1], g)))
        return
    if link == "softmax":
        with numpyro.plate("coordinates", mean.shape[-1], dim=-1), numpyro.plate("inputs", n, dim=-2):
            z = numpyro.sample("z", dist.Normal(0.0, 1.0))
        g = numpyro.deterministic("f", mean + scale * (chol @ z))
        with numpyro.plate("inputs", n):
            numpyro.sample("y", dist.Categorical(logits=ZeroSumTransform()(g)), obs=y)
        return
    with numpyro.plate("inputs", n):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
    f = numpyro.deterministic("f", mean + chol @ z)
    with numpyro.plate("inputs", n):
        if link == "logit":
            numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)
        else:
            numpyro.sample("y", dist.Poisson(jnp.exp(f)), obs=y)


def kernel_matrices(params, x, test):
    kernel = rbf_kernel(params)
    k = np.asarray(kernel(jnp.asarray(x), jnp.asarray(x)), np.float64)
    k += 1e-5 * np.mean(np.diag(k)) * np.eye(len(x))  # jitter: 1000 close inputs make K singular in float64
    ks = np.asarray(kernel(jnp.asarray(test), jnp.asarray(x)), np.float64)
    kss = np.asarray(jax.vmap(lambda t: kernel.evaluate(t, t))(jnp.asarray(test)), np.float64)
    return k, ks, kss


ESS_RUN = (1000, 2000)
"""Elliptical slice sampling of the full latent GP: warm-up and kept steps (one chain)."""


def latent_draws(method, chol, mean, link, y, scale):
    """``(cold, warm, draws of f, verdict or ESS's effective sample size)`` of the full latent GP by
    the joint Laplace fit (``"laplace"``) or elliptical slice sampling (``"ess"``, the reference)."""
    args, kwargs = (chol, mean, link), dict(y=y, scale=scale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if method == "laplace":
            lm = LaplaceMatching(latent_gp, progress_bar=False)
            cold, _ = timed(lambda: lm.run(jax.random.PRNGKey(0), *args, **kwargs).get_samples()["f"])
            warm, f = timed(lambda: lm.run(jax.random.PRNGKey(1), *args, **kwargs).get_samples()["f"])
            return cold, warm, np.asarray(f, np.float64), f"trusted={lm.diagnostics()['trusted']}"
        mcmc = MCMC(EllipticalSlice(latent_gp), num_warmup=ESS_RUN[0], num_samples=ESS_RUN[1], progress_bar=False)
        cold, _ = timed(lambda: mcmc.run(jax.random.PRNGKey(0), *args, **kwargs) or mcmc.get_samples()["f"])
        warm, _ = timed(lambda: mcmc.run(jax.random.PRNGKey(1), *args, **kwargs) or mcmc.get_samples()["f"])
        f = np.asarray(mcmc.get_samples()["f"], np.float64)
        ess = float(np.min(effective_sample_size(f.reshape(1, len(f), -1))))
        return cold, warm, f, f"min ESS {ess:.0f}"


def full_gp(params, x, y, test, link, method="laplace"):
    """``(cold, warm, test draws of f (S, n_test[, K]), note)`` of the full latent GP on LM + GP's kernel."""
    scale = None
    if link in ("softmax", "expm"):  # LM + GP's prior: unit input kernel, an amplitude and a mean per coordinate
        scale = np.exp(np.asarray(params.log_amplitude, np.float32))
        params = params._replace(log_amplitude=jnp.zeros(()))
        mean = np.asarray(params.mean, np.float32)
    else:
        mean = float(params.mean)
    k, ks, kss = kernel_matrices(params, x, test)
    chol = np.linalg.cholesky(k).astype(np.float32)
    cold, warm, f, note = latent_draws(method, chol, mean, link, y, scale)
    # the GP conditional of the test values given f: mean m + A (f - m), variance kss - diag(A K*')
    a = np.linalg.solve(k, ks.T).T
    cond_sd = np.sqrt(np.maximum(kss - np.einsum("ij,ij->i", a, ks), 0.0))
    rng = np.random.default_rng(2)
    if link == "softmax":  # the GP conditional per coordinate, then the lift to K zero-sum logits
        noise = cond_sd[:, None] * scale * rng.standard_normal((len(f), len(test), mean.shape[-1]))
        g_test = mean + np.einsum("tn,snk->stk", a, f - mean) + noise
        f_test = np.asarray(ZeroSumTransform()(jnp.asarray(g_test)))
    elif link == "expm":  # the same per coordinate, then the covariance matrices
        noise = cond_sd[:, None] * scale * rng.standard_normal((len(f), len(test), mean.shape[-1]))
        g_test = mean + np.einsum("tn,snk->stk", a, f - mean) + noise
        f_test = np.asarray(SymmetricMatrixExpTransform()(jnp.asarray(g_test, jnp.float32)))
    else:
        f_test = mean + (f - mean) @ a.T + cond_sd * rng.standard_normal((len(f), len(test)))
    return cold, warm, f_test, note


# ------------------------------------------------------------------ scores


def binary_scores(p, y):
    p = np.clip(p, 1e-9, 1 - 1e-9)
    nll = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    confidence, predicted = np.maximum(p, 1 - p), (p > 0.5).astype(float)
    bins = np.minimum((confidence - 0.5) * 20, 9).astype(int)  # 10 bins over [0.5, 1]
    ece = sum(np.sum(bins == b) / len(p) * abs(np.mean(predicted[bins == b] == y[bins == b]) - np.mean(confidence[bins == b]))
              for b in range(10) if np.any(bins == b))
    return {"accuracy": float(np.mean(predicted == y)), "nll": float(nll), "ece": float(ece)}


def categorical_scores(p, y):
    """Accuracy, NLL and ECE (10 bins of the top class's probability) of ``(n, K)`` class probabilities."""
    p = np.clip(p, 1e-9, 1.0)
    return {"accuracy": float(np.mean(p.argmax(1) == y)), "nll": float(-np.mean(np.log(p[np.arange(len(y)), y]))),
            "ece": metrics.ece(p, y)}


def count_scores(rate_mean, low, high, truth):
    return {"rmse": float(np.sqrt(np.mean((rate_mean - truth) ** 2))),
            "coverage95": float(np.mean((truth >= low) & (truth <= high)))}


def covariance_scores(draws, truth):
    """RMSE of the draws' mean against the true covariances and the share of true entries within
    2 SD of it (the thesis' in2std, Table 3.5), from ``(S, T, p, p)`` draws."""
    mean, sd = draws.mean(0), draws.std(0)
    return {"rmse": float(np.sqrt(np.mean((mean - truth) ** 2))),
            "in2std": float(np.mean(np.abs(mean - truth) <= 2 * sd))}


# -------------------------------------------------------------------- runs


def lm_gp_row(kind, label, x, y, xt, labels, score, **options):
    """LM + GP timed cold and warm (pseudo-observations, hyperparameter search, prediction) and
    the solve alone at the found kernel (pseudo-observations and the GP's prediction), warm."""
    model = LMGP(kind, **options)
    cold, _ = timed(lambda: model.fit(x, y, labels=labels).predict(xt).expected)
    warm, pred = timed(lambda: model.fit(x, y, labels=labels).predict(xt))

    def solve():
        pseudo = pseudo_observations(x, y, kind, labels, model.eps, model.num_classes)
        if model.choices.newton_steps:
            pseudo = relinearise(pseudo, model.params, num_steps=model.choices.newton_steps)[0]
        return predictive(model.params, pseudo, xt)[0]

    return (label, cold, warm, timed(solve)[0], score(pred)), model


SAME_KERNEL = "the evidence's kernel"
"""Rows on the kernel that the reference rows share: the pseudo-observations' marginal likelihood
(``search="exact"``), the kernel the full latent GP is measured on."""


def references(params, x, y, xt, link, score):
    """Elliptical slice sampling and the joint Laplace fit of the full latent GP on ``params``."""
    rows = []
    for method, name in (("ess", "elliptical slice, full latent GP"), ("laplace", "joint Laplace latent GP")):
        cold, warm, f_test, note = full_gp(params, x, y, xt, link, method)
        rows.append((f"{name} ({note})", cold, warm, warm, score(f_test)))
    return rows


def same_kernel_rows(kind, x, y, xt, labels, score, **options):
    """LM + GP on the evidence's kernel without and with Newton steps, and that kernel."""
    bare, model = lm_gp_row(kind, f"LM+GP, {SAME_KERNEL}, no Newton steps", x, y, xt, labels, score,
                            search="exact", newton_steps=0, **options)
    newton, _ = lm_gp_row(kind, f"LM+GP, {SAME_KERNEL}, 10 Newton steps", x, y, xt, labels, score,
                          search="exact", newton_steps=10, **options)
    return [bare, newton], model.params


def run_binary():
    x, y, xt, yt = breast_cancer()
    score = lambda pred: binary_scores(np.asarray(pred.expected), yt)  # noqa: E731
    every, _ = lm_gp_row("binary", "LM+GP, every point (default: loo kernel)", x, y, xt, None, score)
    grouped, _ = lm_gp_row("binary", "LM+GP, 50 k-means groups (default: evidence, 10 Newton steps)", x, y, xt,
                           kmeans_labels(x, 50), score)
    same, params = same_kernel_rows("binary", x, y, xt, None, score)
    draws_score = lambda f: binary_scores(np.mean(1 / (1 + np.exp(-f)), axis=0), yt)  # noqa: E731
    return [every, grouped] + same + references(params, x, y, xt, "logit", draws_score)


def count_score(pred, truth):
    """RMSE and 95 % coverage of LM + GP's predicted rate (its matched Gamma's quantiles, from scipy)."""
    gamma = pred.distribution
    low, high = (stats.gamma.ppf(q, np.asarray(gamma.concentration), scale=1 / np.asarray(gamma.rate))
                 for q in (0.025, 0.975))
    return count_scores(np.asarray(pred.expected), low, high, truth)


def run_counts():
    x, y, xt, truth = poisson_toy()
    score = lambda pred: count_score(pred, truth)  # noqa: E731
    groups = kmeans_labels(x, 100)
    rows = [lm_gp_row("counts", "LM+GP, every point (default: 10 Newton steps)", x, y, xt, None, score)[0],
            lm_gp_row("counts", "LM+GP, every point, no Newton steps", x, y, xt, None, score, newton_steps=0)[0],
            lm_gp_row("counts", "LM+GP, 100 k-means groups, no Newton steps", x, y, xt, groups, score,
                      newton_steps=0)[0]]
    grouped, model = lm_gp_row("counts", "LM+GP, 100 k-means groups (default)", x, y, xt, groups, score)

    def draws_score(f):
        rate = np.exp(f)
        low, high = np.quantile(rate, [0.025, 0.975], axis=0)
        return count_scores(rate.mean(0), low, high, truth)

    # the references on the groups' kernel (their inputs are spread like the points')
    return rows + [grouped] + references(model.params, x, y, xt, "log", draws_score)


def run_categorical(name):
    x, y, xt, yt = classification(name)
    k = int(y.max()) + 1
    score = lambda pred: categorical_scores(np.asarray(pred.expected), yt)  # noqa: E731
    # digits: one lengthscale for the 64 pixels (per-pixel lengthscales overfit 200 images)
    options = dict(num_classes=k, ard=name != "digits")
    every, _ = lm_gp_row("categorical", f"LM+GP, every point ({name}; default: loo kernel)", x, y, xt,
                         np.arange(len(y)), score, **options)
    same, params = same_kernel_rows("categorical", x, y, xt, np.arange(len(y)), score, **options)
    draws_score = lambda f: categorical_scores(np.mean(np.asarray(jax.nn.softmax(f, -1)), axis=0), yt)  # noqa: E731
    return [every] + same + references(params, x, y, xt, "softmax", draws_score)


def run_covariance():
    x, r, months, xt, truth = covariance_path()

    def score(pred):
        draws = np.asarray(pred.distribution.sample(jax.random.PRNGKey(0), (2000,)))
        return covariance_scores(draws, truth)

    row, model = lm_gp_row("covariance", "LM+GP, one group per month (default: 10 Newton steps)", x, r, xt, months,
                           score)
    bare, _ = lm_gp_row("covariance", "LM+GP, one group per month, no Newton steps", x, r, xt, months, score,
                        newton_steps=0)
    # the full latent GP: one GP per vech coordinate of each month's logm covariance, the
    # returns' Gaussian likelihood (their counts and scatter matrices per month)
    scatter = np.zeros((len(xt), r.shape[1], r.shape[1]))
    np.add.at(scatter, months, r[:, :, None] * r[:, None, :])
    data = (jnp.full(len(xt), r.shape[0] / len(xt), jnp.float32), jnp.asarray(scatter, jnp.float32))
    full = references(model.params, xt, data, xt, "expm", lambda f: covariance_scores(f, truth))
    # the baseline without a GP: each month's own pseudo-observation mapped back to its inverse Wishart
    alone = pseudo_observations(x, r, "covariance", months)
    own = matched_predictive("covariance", jnp.asarray(alone.mean), jnp.asarray(alone.noise))
    draws = np.asarray(own.sample(jax.random.PRNGKey(0), (2000,)))
    return [row, bare] + full + [("each month's own matched inverse Wishart (no GP)", 0.0, 0.0, 0.0,
                                   covariance_scores(draws, truth))]


def eps_sensitivity():
    """LM + GP's scores at five prior weights: breast cancer (binary, every point), iris, the
    drifting covariances."""
    lines = ["**sensitivity to eps** (LM + GP alone, default options otherwise; the kind's default eps in bold)", "",
             "| eps | binary accuracy | binary NLL | binary ECE | iris accuracy | iris NLL | iris ECE | "
             "covariance RMSE | covariance in2std |", "|---|---|---|---|---|---|---|---|---|"]
    x, y, xt, yt = breast_cancer()
    xi, yi, xti, yti = classification("iris")
    xc, rc, months, xtc, truth = covariance_path()
    for eps in (0.001, 0.01, 0.1, 1.0):
        b = binary_scores(np.asarray(LMGP("binary", eps=eps).fit(x, y, np.arange(len(y))).predict(xt).expected), yt)
        c = categorical_scores(np.asarray(LMGP("categorical", eps=eps).fit(xi, yi, np.arange(len(yi)))
                                          .predict(xti).expected), yti)
        iw = LMGP("covariance", eps=eps).fit(xc, rc, months).predict(xtc).distribution
        w = covariance_scores(np.asarray(iw.sample(jax.random.PRNGKey(0), (2000,))), truth)
        cells = [(b["accuracy"], EPS["binary"]), (b["nll"], EPS["binary"]), (b["ece"], EPS["binary"]),
                 (c["accuracy"], EPS["categorical"]), (c["nll"], EPS["categorical"]), (c["ece"], EPS["categorical"]),
                 (w["rmse"], EPS["covariance"]), (w["in2std"], EPS["covariance"])]
        lines.append(f"| {eps:g} | " + " | ".join(f"**{v:.3f}**" if eps == default else f"{v:.3f}"
                                                  for v, default in cells) + " |")
    return lines


def search_comparison():
    """LM + GP's scores with each kernel search (the leave-one-out predictive of the data and
    the pseudo-observations' evidence): breast cancer, iris and wine (every point), counts (100
    k-means groups) and breast cancer on 50 k-means groups."""
    lines = ["**the kernel search** (LM + GP alone: loo, the data's leave-one-out predictive; exact, the "
             "pseudo-observations' marginal likelihood, each with its default Newton steps; the default search "
             "in bold)", "",
             "| data | search | Newton steps | accuracy or RMSE | NLL or coverage95 | ECE |",
             "|---|---|---|---|---|---|"]
    x, y, xt, yt = breast_cancer()
    cases = [("breast cancer, every point", "binary", x, y, xt, np.arange(len(y)), {},
              lambda pred, yt=yt: binary_scores(np.asarray(pred.expected), yt)),
             ("breast cancer, 50 k-means groups", "binary", x, y, xt, kmeans_labels(x, 50), {},
              lambda pred, yt=yt: binary_scores(np.asarray(pred.expected), yt))]
    for name in ("iris", "wine"):
        xc, yc, xtc, ytc = classification(name)
        cases.append((name, "categorical", xc, yc, xtc, np.arange(len(yc)), dict(num_classes=int(yc.max()) + 1),
                      lambda pred, yt=ytc: categorical_scores(np.asarray(pred.expected), yt)))
    xp, yp, xtp, truth = poisson_toy()
    cases.append(("counts, 100 k-means groups", "counts", xp, yp, xtp, kmeans_labels(xp, 100), {},
                  lambda pred: count_score(pred, truth)))
    for label, kind, xs, ys, xts, groups, options, score in cases:
        default = default_choices(pseudo_observations(xs, ys, kind, groups, None, options.get("num_classes")))
        for search in ("loo", "exact"):
            model = LMGP(kind, search=search, **options).fit(xs, ys, groups)
            scores = score(model.predict(xts))
            values = list(scores.values()) + ([float("nan")] if len(scores) == 2 else [])
            shown = f"**{search}**" if search == default.search else search
            lines.append(f"| {label} | {shown} | {model.choices.newton_steps} | "
                         + " | ".join(f"{v:.3f}" for v in values) + " |")
    return lines


def lm_step_and_wishart_maps():
    """The LM step alone (pseudo-observations of 10^4 points, every point its own group, warm)
    and the batched inverse-Wishart maps on 235 4 x 4 matrices (the thesis' currency example's
    size), cold and warm."""
    from numpyro_lm.families import get_family

    rng = np.random.default_rng(0)
    n = 10_000
    x = rng.normal(size=(n, 2))
    data = {"binary": rng.integers(0, 2, n).astype(float), "counts": rng.poisson(3.0, n).astype(float),
            "categorical": rng.integers(0, 10, n)}
    lines = ["**the LM step and the matrix maps**", "", "| what | cold s | warm s |", "|---|---|---|"]
    for kind, y in data.items():
        cold, _ = timed(lambda: pseudo_observations(x, y, kind, np.arange(n)).mean)
        warm, _ = timed(lambda: pseudo_observations(x, y, kind, np.arange(n)).mean)
        lines.append(f"| LM step, {kind}, 10^4 points | {cold:.3f} | {warm:.4f} |")
    a = rng.normal(size=(235, 4, 4))
    params = {"concentration": jnp.asarray(rng.uniform(6, 20, 235), jnp.float32),
              "scale_matrix": jnp.asarray(a @ a.transpose(0, 2, 1) + 4 * np.eye(4), jnp.float32)}
    for basis in ("logm", "sqrtm"):
        family = get_family("inverse_wishart", basis)
        cold, gaussian = timed(lambda: family.to_gaussian(params))
        warm, gaussian = timed(lambda: family.to_gaussian(params))
        lines.append(f"| inverse Wishart -> Gaussian ({basis}), 235 matrices | {cold:.2f} | {warm:.4f} |")
        cold, _ = timed(lambda: family.from_gaussian(*gaussian))
        warm, _ = timed(lambda: family.from_gaussian(*gaussian))
        lines.append(f"| Gaussian -> inverse Wishart ({basis}), 235 matrices | {cold:.2f} | {warm:.4f} |")
    return lines


def table(title, rows, keys):
    lines = [f"**{title}**", "", "| method | cold s | warm s | solve s | " + " | ".join(keys) + " |",
             "|---|---|---|---|" + "---|" * len(keys)]
    for name, cold, warm, solve, scores in rows:
        lines.append(f"| {name} | {cold:.2f} | {warm:.3f} | {solve:.4f} | "
                     + " | ".join(f"{scores[k]:.3f}" for k in keys) + " |")
    full = next(r for r in rows if r[0].startswith("joint Laplace"))
    lines += ["", "- The joint Laplace GP's time against LM + GP's: "
              + "; ".join(f"{r[0]}: {full[2] / r[2]:.1f}x warm, {full[2] / r[3]:.0f}x its solve"
                          for r in rows if r[0].startswith("LM+GP"))
              + "."]
    return lines


def main():
    lines = [environment() + ". Cold: the first fit and prediction (compilation included); warm: a refit of the "
             "same shapes (LM + GP: pseudo-observations, 100 Adam steps on the kernel's objective, the Newton steps "
             "if any, prediction); solve: LM + GP at the kernel it found (pseudo-observations, Newton steps and the "
             "GP's prediction), warm. Each LM + GP row names its kernel search and Newton steps: the default (the "
             "labels' leave-one-out predictive; the evidence and 10 Newton steps for counts and covariances) or "
             f"{SAME_KERNEL} (the pseudo-observations' marginal likelihood), the kernel the full latent GP "
             "(elliptical slice sampling, the reference, and the joint Laplace fit) gets with no search of its "
             "own; their solve column repeats their warm time. Binary: breast cancer, 400 training / 169 test "
             "points; counts: 1000 Poisson counts, the true rate at 200 test inputs (the references on the 100 "
             "groups' kernel); covariances: 235 months of 21 4-vectors.", ""]
    lines += table("binary (Beta, logit basis)", run_binary(), ["accuracy", "nll", "ece"]) + [""]
    lines += table("counts (Gamma, log basis)", run_counts(), ["rmse", "coverage95"]) + [""]
    for name in ("iris", "wine", "digits"):
        lines += table(f"categories: {name} (Dirichlet, softmax basis)", run_categorical(name),
                       ["accuracy", "nll", "ece"]) + [""]
    lines += table("covariances (inverse Wishart, logm basis)", run_covariance(), ["rmse", "in2std"]) + [""]
    lines += search_comparison() + [""]
    lines += eps_sensitivity() + [""]
    lines += lm_step_and_wishart_maps()
    text = "\n".join(lines)
    print(text)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "lm_gp.md"), "w") as f:
        f.write(f"<!-- written by benchmarks/lm_gp.py on {time.strftime('%Y-%m-%d')}; do not edit -->\n{text}\n")


if __name__ == "__main__":
    main()

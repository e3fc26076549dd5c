"""LM + GP against the full latent GP on the same kernel: accuracy, calibration and time.

Two data kinds so far (the thesis' chapter 3; categories and covariance matrices are not built yet):

- ``binary``: scikit-learn's breast-cancer data (569 points, 30 standardised features), a
  fixed 400 / 169 split; LM + GP on every training point, and on 50 k-means groups;
- ``counts``: Poisson counts of a generated rate ``exp(1 + sin(2 x) + x / 3)`` at 1000 inputs on
  [-3, 3] (the thesis' toy's spirit), and the true rate at 200 test inputs.

For each: LM + GP (``numpyro_lm.gp.LMGP``: pseudo-observations, kernel hyperparameters by
marginal likelihood, predictions) timed cold (compilation included) and warm (a refit); then
the full latent GP with the hyperparameters LM + GP found, whitened (``f = m + L z``,
``z ~ N(0, I)``), fitted by ``LaplaceMatching(model).run`` (joint Laplace, timed the same way),
its test predictions from 1000 of its draws of ``f`` through the GP conditional. LM + GP is
also timed at the kernel it found (the "solve": what LM + GP adds to one GP regression). Reported:
accuracy, negative log likelihood (NLL) and expected calibration error (ECE, 10 bins) on the
test labels (binary); RMSE of the predicted rate against the truth and the share of true
rates inside the central 95 % interval (counts); and LM + GP's speed-up over the joint
Laplace GP. ``python benchmarks/lm_gp.py`` writes ``benchmarks/results/lm_gp.md``.
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

from numpyro_lm import LaplaceMatching  # noqa: E402
from numpyro_lm.gp import LMGP, latent_predictive, pseudo_observations, rbf_kernel  # noqa: E402

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


def kmeans_labels(x, k, seed=0):
    from sklearn.cluster import KMeans

    return KMeans(k, n_init=4, random_state=seed).fit(x).labels_


# -------------------------------------------------------------- the full GP


def latent_gp(chol, mean, link, y=None):
    """The whitened latent GP: ``f = mean + L z``, ``y ~ Bernoulli(logits=f)`` or ``Poisson(exp f)``."""
    with numpyro.plate("inputs", chol.shape[0]):
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
    f = numpyro.deterministic("f", mean + chol @ z)
    with numpyro.plate("inputs", chol.shape[0]):
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


def full_gp(params, x, y, test, link):
    """``(cold, warm, test draws of f (S, n_test), verdict)`` of the joint Laplace fit of the latent GP."""
    k, ks, kss = kernel_matrices(params, x, test)
    chol = np.linalg.cholesky(k).astype(np.float32)
    mean = float(params.mean)
    lm = LaplaceMatching(latent_gp, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cold, _ = timed(lambda: lm.run(jax.random.PRNGKey(0), chol, mean, link, y=y).get_samples()["f"])
        warm, f = timed(lambda: lm.run(jax.random.PRNGKey(1), chol, mean, link, y=y).get_samples()["f"])
    f = np.asarray(f, np.float64)
    # the GP conditional of the test values given f: mean m + A (f - m), variance kss - diag(A K*')
    a = np.linalg.solve(k, ks.T).T
    cond_sd = np.sqrt(np.maximum(kss - np.einsum("ij,ij->i", a, ks), 0.0))
    rng = np.random.default_rng(2)
    f_test = mean + (f - mean) @ a.T + cond_sd * rng.standard_normal((len(f), len(test)))
    return cold, warm, f_test, lm.diagnostics()["trusted"]


# ------------------------------------------------------------------ scores


def binary_scores(p, y):
    p = np.clip(p, 1e-9, 1 - 1e-9)
    nll = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    confidence, predicted = np.maximum(p, 1 - p), (p > 0.5).astype(float)
    bins = np.minimum((confidence - 0.5) * 20, 9).astype(int)  # 10 bins over [0.5, 1]
    ece = sum(np.sum(bins == b) / len(p) * abs(np.mean(predicted[bins == b] == y[bins == b]) - np.mean(confidence[bins == b]))
              for b in range(10) if np.any(bins == b))
    return {"accuracy": float(np.mean(predicted == y)), "nll": float(nll), "ece": float(ece)}


def count_scores(rate_mean, low, high, truth):
    return {"rmse": float(np.sqrt(np.mean((rate_mean - truth) ** 2))),
            "coverage95": float(np.mean((truth >= low) & (truth <= high)))}


# -------------------------------------------------------------------- runs


def lm_gp_row(kind, label, x, y, xt, labels, score):
    """LM + GP timed cold and warm (pseudo-observations, hyperparameter search, prediction) and
    the solve alone at the found kernel (pseudo-observations and the GP's prediction), warm."""
    model = LMGP(kind)
    cold, _ = timed(lambda: model.fit(x, y, labels=labels).predict(xt).expected)
    warm, pred = timed(lambda: model.fit(x, y, labels=labels).predict(xt))
    solve, _ = timed(lambda: latent_predictive(model.params, pseudo_observations(x, y, kind, labels), xt)[0])
    return (label, cold, warm, solve, score(pred)), model


def run_binary():
    x, y, xt, yt = breast_cancer()
    score = lambda pred: binary_scores(np.asarray(pred.expected), yt)  # noqa: E731
    every, model = lm_gp_row("binary", "LM+GP, every point", x, y, xt, None, score)
    grouped, _ = lm_gp_row("binary", "LM+GP, 50 k-means groups", x, y, xt, kmeans_labels(x, 50), score)
    cold, warm, f_test, trusted = full_gp(model.params, x, y, xt, "logit")
    p = np.mean(1 / (1 + np.exp(-f_test)), axis=0)
    return [every, grouped, (f"joint Laplace latent GP (LaplaceMatching, trusted={trusted})", cold, warm, warm,
                             binary_scores(p, yt))]


def run_counts():
    x, y, xt, truth = poisson_toy()

    def score(pred):
        gamma = pred.distribution  # the rate's matched Gamma per test input: its quantiles from scipy
        low, high = (stats.gamma.ppf(q, np.asarray(gamma.concentration), scale=1 / np.asarray(gamma.rate))
                     for q in (0.025, 0.975))
        return count_scores(np.asarray(pred.expected), low, high, truth)

    every, _ = lm_gp_row("counts", "LM+GP, every point", x, y, xt, None, score)
    grouped, model = lm_gp_row("counts", "LM+GP, 100 k-means groups", x, y, xt, kmeans_labels(x, 100), score)
    cold, warm, f_test, trusted = full_gp(model.params, x, y, xt, "log")
    rate = np.exp(f_test)
    low, high = np.quantile(rate, [0.025, 0.975], axis=0)
    return [every, grouped, (f"joint Laplace latent GP (LaplaceMatching, trusted={trusted})", cold, warm, warm,
                             count_scores(rate.mean(0), low, high, truth))]


def table(title, rows, keys):
    lines = [f"**{title}**", "", "| method | cold s | warm s | solve s | " + " | ".join(keys) + " |",
             "|---|---|---|---|" + "---|" * len(keys)]
    for name, cold, warm, solve, scores in rows:
        lines.append(f"| {name} | {cold:.2f} | {warm:.3f} | {solve:.4f} | "
                     + " | ".join(f"{scores[k]:.3f}" for k in keys) + " |")
    full = rows[-1]
    lines += ["", "- The joint Laplace GP's time against LM + GP's: "
              + "; ".join(f"{r[0]}: {full[2] / r[2]:.1f}x warm, {full[2] / r[3]:.0f}x its solve" for r in rows[:-1])
              + "."]
    return lines


def main():
    lines = [environment() + ". Cold: the first fit and prediction (compilation included); warm: a refit of the "
             "same shapes (LM + GP: pseudo-observations, 300 Adam steps on the kernel's marginal likelihood, "
             "prediction); solve: LM + GP at the kernel it found (pseudo-observations and the GP's prediction), "
             "warm. The joint Laplace GP gets LM + GP's kernel (every point's for binary data, the groups' for "
             "counts) and no search of its own; its solve column repeats its warm time. Binary: breast cancer, 400 "
             "training / 169 test points; counts: 1000 Poisson counts, the true rate at 200 test inputs.", ""]
    lines += table("binary (Beta, logit basis)", run_binary(), ["accuracy", "nll", "ece"]) + [""]
    lines += table("counts (Gamma, log basis)", run_counts(), ["rmse", "coverage95"])
    text = "\n".join(lines)
    print(text)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "lm_gp.md"), "w") as f:
        f.write(f"<!-- written by benchmarks/lm_gp.py on {time.strftime('%Y-%m-%d')}; do not edit -->\n{text}\n")


if __name__ == "__main__":
    main()

"""
LM + GP: Gaussian processes on binary labels, categories, counts and covariances (thesis chapter 3).
====================================================================================================

``LMGP(kind).fit(x, y)`` turns the data into Gaussian pseudo-observations by Laplace Matching
(a Beta, Dirichlet, Gamma or inverse Wishart per group of points, in its Gaussian basis),
fits an ordinary GP to them (the kernel by the labels' leave-one-out predictive or the
evidence; for counts and covariances Newton steps towards the Laplace GP) and maps each
prediction back to the matched family: a Beta over a probability, a Dirichlet over class
probabilities, a Gamma over a rate, an inverse Wishart over a covariance matrix.

1. Binary labels: scikit-learn's breast-cancer data, accuracy and a few predicted Betas.
2. Categories: iris, class probabilities from the predicted Dirichlets.
3. Counts inside a NumPyro model: the collapsed LM + GP model (``lm_gp_model``) has only the
   kernel's hyperparameters as latent sites, so NUTS samples them in seconds; the prediction
   averages over their draws. The picture is saved to ``examples/output/lm_gp_counts.png``.
4. Covariances: a 3 x 3 covariance drifting over 120 months, 21 zero-mean vectors a month; the
   predicted inverse Wishart per month against the truth, saved to
   ``examples/output/lm_gp_covariance.png``.

Needs scikit-learn for the data (``pip install -e ".[data]"``). Run with
``.venv/bin/python examples/lm_gp.py`` (about a minute on 2 cores).
"""

import os
import time

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402
from scipy import stats  # noqa: E402

from numpyro_lm.contrib.gp import LMGP, pseudo_observations  # noqa: E402
from numpyro_lm.contrib.gp.component import lm_gp_model, predict_with_draws  # noqa: E402
from numpyro_lm.contrib.gp.regression import matched_predictive  # noqa: E402

# sphinx-gallery runs an example from its own folder and sets no __file__
HERE = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else os.getcwd()
OUTPUT = os.path.join(HERE, "output")


def split(x, y, train, seed=0):
    order = np.random.default_rng(seed).permutation(len(x))
    return x[order[:train]], y[order[:train]], x[order[train:]], y[order[train:]]


def binary():
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x = (data.data - data.data.mean(0)) / data.data.std(0)
    x, y, xt, yt = split(x, data.target.astype(float), 400)
    start = time.perf_counter()
    pred = LMGP("binary").fit(x, y).predict(xt)
    print(f"binary: {len(x)} training points, fit and predict {time.perf_counter() - start:.1f} s, "
          f"test accuracy {np.mean((pred.expected > 0.5) == yt):.3f}")
    beta = pred.distribution
    for i in range(3):
        a, b = float(beta.concentration1[i]), float(beta.concentration0[i])
        low, high = stats.beta.ppf([0.05, 0.95], a, b)
        print(f"  test point {i}: P(benign) ~ Beta({a:.2f}, {b:.2f}), mean {pred.expected[i]:.3f}, "
              f"90% interval [{low:.3f}, {high:.3f}], label {int(yt[i])}")


def categories():
    from sklearn.datasets import load_iris

    data = load_iris()
    x = (data.data - data.data.mean(0)) / data.data.std(0)
    x, y, xt, yt = split(x, data.target, 105)
    pred = LMGP("categorical").fit(x, y).predict(xt)
    print(f"categories: iris, test accuracy {np.mean(pred.expected.argmax(1) == yt):.3f}; the first test point's "
          f"Dirichlet {np.round(np.asarray(pred.distribution.concentration[0]), 2)} (class {yt[0]})")


def counts():
    rng = np.random.default_rng(0)
    rate = lambda x: np.exp(1.0 + np.sin(2.0 * x) + x / 3.0)  # noqa: E731
    x = np.sort(rng.uniform(-3, 3, 300))
    y = rng.poisson(rate(x)).astype(float)
    labels = np.minimum(((x + 3) / 6 * 40).astype(int), 39)  # 40 bins of the input: conjugate grouping
    pseudo = pseudo_observations(x, y, "counts", labels)
    start = time.perf_counter()
    mcmc = MCMC(NUTS(lm_gp_model), num_warmup=300, num_samples=300, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), pseudo)
    grid = np.linspace(-3, 3, 200)
    mean, var = predict_with_draws(mcmc.get_samples(), pseudo, grid)
    gamma = matched_predictive("counts", mean, var)
    print(f"counts: NUTS over the kernel's hyperparameters of the collapsed model ({len(pseudo.mean)} groups) and "
          f"the averaged prediction: {time.perf_counter() - start:.1f} s")
    low, high = (stats.gamma.ppf(q, np.asarray(gamma.concentration), scale=1 / np.asarray(gamma.rate))
                 for q in (0.025, 0.975))
    inside = np.mean((rate(grid) >= low) & (rate(grid) <= high))
    print(f"  the true rate lies inside the predicted Gammas' 95% intervals at {inside:.0%} of 200 inputs")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.scatter(x, y, s=6, color="0.6", label="counts")
    ax.plot(grid, rate(grid), "k--", label="true rate")
    ax.plot(grid, np.asarray(gamma.mean), color="C0", label="LM + GP (Gamma mean)")
    ax.fill_between(grid, low, high, color="C0", alpha=0.25, label="95% of the Gamma")
    ax.set_xlabel("x")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(OUTPUT, "lm_gp_counts.png"), dpi=120)


def covariances():
    rng = np.random.default_rng(1)
    months, per_month, p = 120, 21, 3
    s = np.arange(months) / months
    sd = 0.5 + 0.3 * np.sin(2 * np.pi * (s[:, None] + np.arange(p) / p))
    rho = 0.6 * np.sin(np.pi * s)
    corr = np.stack([np.eye(p) + r * (np.ones((p, p)) - np.eye(p)) / 2 for r in rho])
    truth = sd[:, :, None] * corr * sd[:, None, :]
    returns = np.concatenate([rng.multivariate_normal(np.zeros(p), c, per_month) for c in truth])
    time_in_years = np.repeat(np.arange(months) / 12, per_month)
    start = time.perf_counter()
    lm = LMGP("covariance").fit(time_in_years, returns, labels=np.repeat(np.arange(months), per_month))
    pred = lm.predict(np.arange(months) / 12)
    draws = np.asarray(pred.distribution.sample(jax.random.PRNGKey(0), (1000,)))
    low, high = np.quantile(draws, [0.025, 0.975], axis=0)
    sample = lm.pseudo.params["scale_matrix"] / per_month
    print(f"covariances: {months} months of {per_month} vectors, fit and predict {time.perf_counter() - start:.1f} s; "
          f"RMSE against the truth {np.sqrt(np.mean((pred.expected - truth) ** 2)):.3f} "
          f"(each month's own sample covariance: {np.sqrt(np.mean((sample - truth) ** 2)):.3f})")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    t = np.arange(months) / 12
    for (i, j), colour in zip([(0, 0), (0, 1)], ["C0", "C1"]):
        ax.plot(t, truth[:, i, j], "--", color=colour, label=f"true entry ({i}, {j})")
        ax.plot(t, np.asarray(pred.expected)[:, i, j], color=colour, label=f"LM + GP ({i}, {j})")
        ax.fill_between(t, low[:, i, j], high[:, i, j], color=colour, alpha=0.2)
    ax.set_xlabel("years")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(OUTPUT, "lm_gp_covariance.png"), dpi=120)


if __name__ == "__main__":
    os.makedirs(OUTPUT, exist_ok=True)
    binary()
    categories()
    counts()
    covariances()

"""The Laplace Bridge on a small neural network: accuracy, calibration, OOD detection, top-k and
microseconds per prediction, against Monte Carlo over the logits (thesis chapter 4, Tables 4.1
and 4.5, Fig. 4.5).

Data that ship with scikit-learn: digits (8 x 8 images / 16, a fixed 70 / 30 split). An MLP
64-32-10 (tanh) is trained with optax (Adam, weight decay 1e-4, 2000 full-batch steps); its
last layer gets a Laplace posterior (``numpyro_lm.contrib.nn.LastLayerLaplace``) with the Kronecker
and the full curvature, at two prior scales (prior SD 1 and 0.3 on the weights: precision 1
and 11.1). Three settings:

- ``digits``: trained on all ten classes; in-distribution scores on the test split, and OOD
  AUROC (the top class's probability) against the test images rotated by 90 degrees and
  against pure noise images (uniform on [0, 1]);
- ``digits 0-4``: trained on 0-4; OOD AUROC against the test images of 5-9 (the thesis' split).

Every predictive (``numpyro_lm.contrib.nn.predictive``) is scored: accuracy, NLL, ECE, Brier, the mean
KL divergence from a 20 000-draw Monte Carlo reference of the same logit Gaussian, OOD AUROC,
and microseconds per prediction (warm, the logit covariance included, the whole test split in
one compiled call, the best of five). The uncertainty-aware top-k (thesis Algorithm 4) is
scored on the bridge's Dirichlets; the MC draws needed to reach the bridge's KL are plotted
(``benchmarks/results/bnn_bridge_mc_draws.png``, thesis Fig. 4.5), and two moons show the
MAP's overconfidence away from the data against the bridge's
(``benchmarks/results/bnn_bridge_moons.png``). The thesis' Fig. 4.5 measures distributions on
the simplex, not predictive means: ``marginal_kls`` scores each class probability's marginal
(the bridge's Beta against MC(S)'s histogram, both against the 20 000-draw reference), on the
digits network and on Gaussians that are Laplace images of Dirichlets (the bridge's own
assumption, as a control), beside ``bridge_spread_factor``. ``python benchmarks/bnn_bridge.py``
writes ``benchmarks/results/bnn_bridge.md``.
"""

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import environment  # noqa: E402

from numpyro_lm.contrib.bridge import uncertainty_aware_top_k  # noqa: E402
from numpyro_lm.contrib.nn import LastLayerLaplace, class_probabilities, logit_gaussian, metrics  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PRIOR_SDS = (1.0, 0.3)
STRUCTURES = ("kron", "full")
METHODS = ("bridge", "bridge_zero_sum", "lb_norm", "lb_norm_sum", "probit", "mc100", "mc1000")
REFERENCE_DRAWS = 20_000
MARGINAL_INPUTS = 200  # test inputs for the per-class marginal KL (20 000 x 200 x 10 float64 draws)


# ------------------------------------------------------------------ data and network


def digits(seed=0):
    from sklearn.datasets import load_digits

    data = load_digits()
    x, y = data.data / 16.0, data.target
    order = np.random.default_rng(seed).permutation(len(x))
    split = int(0.7 * len(x))
    return x[order[:split]], y[order[:split]], x[order[split:]], y[order[split:]]


def rotated(x):
    return np.rot90(x.reshape(-1, 8, 8), axes=(1, 2)).reshape(-1, 64)


def train_mlp(x, y, num_classes, hidden=32, steps=2000, seed=0, activation=jnp.tanh):
    """``(feature_fn, W2, b2)`` of an MLP ``activation(x W1 + b1) W2 + b2`` trained by Adam."""
    key1, key2 = jax.random.split(jax.random.PRNGKey(seed))
    params = {"w1": jax.random.normal(key1, (x.shape[1], hidden)) / np.sqrt(x.shape[1]), "b1": jnp.zeros(hidden),
              "w2": jax.random.normal(key2, (hidden, num_classes)) / np.sqrt(hidden), "b2": jnp.zeros(num_classes)}
    xs, ys = jnp.asarray(x, jnp.float32), jnp.asarray(y)

    def loss(p):
        logits = activation(xs @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), ys[:, None], 1))

    optimiser = optax.adamw(1e-2, weight_decay=1e-4)

    @jax.jit
    def run(p):
        def step(carry, _):
            p, state = carry
            grads = jax.grad(loss)(p)
            updates, state = optimiser.update(grads, state, p)
            return (optax.apply_updates(p, updates), state), None

        return jax.lax.scan(step, (p, optimiser.init(p)), None, length=steps)[0][0]

    p = run(params)
    w1, b1 = p["w1"], p["b1"]
    return (lambda inputs: activation(jnp.asarray(inputs, jnp.float32) @ w1 + b1)), p["w2"], p["b2"]


# ------------------------------------------------------------------ predictives


def predictor(method):
    """A compiled ``(posterior, features, key) -> probabilities`` for ``method`` (logit covariance included)."""
    base, draws = (method[:2], int(method[2:])) if method.startswith("mc") else (method, 0)

    def run(posterior, features, key):
        mean, cov = logit_gaussian(posterior, features)
        if draws:
            return class_probabilities(mean, cov, "mc", num_samples=draws, rng_key=key).probabilities
        return class_probabilities(mean, cov, base).probabilities

    return jax.jit(run)


def reference(posterior, features, key, draws=REFERENCE_DRAWS, chunk=2000):
    """The MC reference: the average softmax over ``draws`` logit draws, in chunks."""
    mean, cov = logit_gaussian(posterior, features)
    total = 0.0
    for i, k in enumerate(jax.random.split(key, draws // chunk)):
        total = total + class_probabilities(mean, cov, "mc", num_samples=chunk, rng_key=k).probabilities
    return np.asarray(total / (draws // chunk), np.float64)


def kl(p, q):
    """Mean KL(p || q) between rows of class probabilities."""
    p, q = np.clip(p, 1e-12, 1.0), np.clip(np.asarray(q, np.float64), 1e-12, 1.0)
    return float(np.mean(np.sum(p * (np.log(p) - np.log(q)), -1)))


MARGINAL_BINS = 20


def log_odds_draws(mean, cov, num, key):
    """``(num, n, K)`` draws of each class probability's log-odds ``z_k - logsumexp_{l != k} z_l``
    under ``z ~ N(mean, cov)``, in float64 (a float32 softmax rounds confident classes to 1)."""
    mean, cov = np.asarray(mean, np.float64), np.asarray(cov, np.float64)
    chol = np.linalg.cholesky(cov + 1e-6 * np.eye(mean.shape[-1]))
    z = mean + np.einsum("ikl,sil->sik", chol, np.asarray(jax.random.normal(key, (num,) + mean.shape), np.float64))
    out = np.empty_like(z)
    for k in range(z.shape[-1]):
        others = np.delete(z, k, -1)
        top = others.max(-1)
        out[..., k] = z[..., k] - top - np.log(np.exp(others - top[..., None]).sum(-1))
    return out


def beta_log_odds_cdf(u, a, b):
    """The CDF of ``Beta(a, b)`` at ``sigmoid(u)``, by the symmetric form above 1/2 (no 1 - x loss)."""
    from scipy.special import betainc, expit

    return np.where(u < 0, betainc(a, b, expit(u)), 1.0 - betainc(b, a, expit(-u)))


def marginal_kls(mean, cov, key, draws=(10, 100, 1000)):
    """Thesis Fig. 4.5's measure on each class probability's marginal: KL(true || approximation)
    over the 20 equal-mass bins of the 20 000-draw reference (in log-odds), averaged over classes
    and inputs. The bridges' Dirichlets give each bin's mass in closed form (Beta marginals); MC(S)
    gives histogram shares of S draws, with half a count added to each bin (a bin an approximation
    leaves empty would make the KL infinite)."""
    ref = log_odds_draws(mean, cov, REFERENCE_DRAWS, key)
    edges = np.quantile(ref, np.linspace(0, 1, MARGINAL_BINS + 1)[1:-1], axis=0)  # (B - 1, n, K)
    true = 1.0 / MARGINAL_BINS

    def kl_bins(q):
        return float(np.mean(np.sum(true * (np.log(true) - np.log(np.clip(q, 1e-300, None))), 0)))

    out = {}
    for method in ("bridge_zero_sum", "lb_norm"):
        alpha = np.asarray(class_probabilities(mean, cov, method).concentration, np.float64)
        cdf = beta_log_odds_cdf(edges, alpha, alpha.sum(-1, keepdims=True) - alpha)
        zeros = np.zeros((1,) + cdf.shape[1:])
        out[method] = kl_bins(np.diff(np.concatenate([zeros, cdf, zeros + 1.0]), axis=0))
    for s in draws:
        bins = (log_odds_draws(mean, cov, s, jax.random.fold_in(key, s))[None] > edges[:, None]).sum(0)
        counts = np.stack([(bins == b).sum(0) for b in range(MARGINAL_BINS)])
        out[f"mc{s}"] = kl_bins((counts + 0.5) / (s + 0.5 * MARGINAL_BINS))
    return out


def in_family_gaussians(num=200, k=10, seed=0):
    """Logit Gaussians that are Laplace images of Dirichlets (concentrations Gamma(2) * 5): where
    the bridge's assumption holds, as a control for :func:`marginal_kls`."""
    from numpyro_lm.families import dirichlet_to_zero_sum_gaussian

    alpha = 5.0 * np.random.default_rng(seed).gamma(2.0, size=(num, k))
    mean, cov = dirichlet_to_zero_sum_gaussian(jnp.asarray(alpha, jnp.float32))
    return mean, cov + 1e-4 * jnp.eye(k)  # zero-sum: rank K - 1; the jitter is far below 1/alpha


def microseconds(fn, posterior, features, key, repeats=5):
    jax.block_until_ready(fn(posterior, features, key))
    best = min(_timed(fn, posterior, features, key) for _ in range(repeats))
    return 1e6 * best / features.shape[0]


def _timed(fn, *args):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


# ------------------------------------------------------------------ runs


def setting(name, x, y, xt, yt, outs, num_classes):
    """Rows for one trained network: every structure, prior scale and predictive."""
    feature_fn, w2, b2 = train_mlp(x, y, num_classes)
    map_probabilities = np.asarray(jax.nn.softmax(feature_fn(xt) @ w2 + b2))
    rows, extras = [], {}
    map_scores = dict(accuracy=float(np.mean(map_probabilities.argmax(1) == yt)), nll=metrics.nll(map_probabilities, yt),
                      ece=metrics.ece(map_probabilities, yt), brier=metrics.brier(map_probabilities, yt), kl=float("nan"),
                      us=float("nan"))
    for label, xo in outs.items():
        out = np.asarray(jax.nn.softmax(feature_fn(xo) @ w2 + b2))
        map_scores[f"auroc {label}"] = metrics.auroc(metrics.confidence(map_probabilities), metrics.confidence(out))
    rows.append((name, "-", "-", "MAP (no posterior)", map_scores))
    predictors = {m: predictor(m) for m in METHODS}
    features_test = feature_fn(xt)
    features_out = {label: feature_fn(xo) for label, xo in outs.items()}
    for structure in STRUCTURES:
        for sd in PRIOR_SDS:
            lll = LastLayerLaplace(feature_fn, w2, b2, structure=structure, prior_precision=1 / sd**2).fit(x, y)
            post = lll.posterior
            ref = reference(post, features_test, jax.random.PRNGKey(11))
            for method, fn in predictors.items():
                key = jax.random.PRNGKey(3)
                p = np.asarray(fn(post, features_test, key), np.float64)
                scores = dict(accuracy=float(np.mean(p.argmax(1) == yt)), nll=metrics.nll(p, yt), ece=metrics.ece(p, yt),
                              brier=metrics.brier(p, yt), kl=kl(ref, p), us=microseconds(fn, post, features_test, key))
                for label, fo in features_out.items():
                    out = np.asarray(fn(post, fo, key))
                    scores[f"auroc {label}"] = metrics.auroc(metrics.confidence(p), metrics.confidence(out))
                rows.append((name, structure, f"{sd:g}", method, scores))
            if structure == "kron" and name == "digits":
                mean, cov = logit_gaussian(post, features_test[:MARGINAL_INPUTS])
                factor = np.asarray(class_probabilities(mean, cov, "bridge_zero_sum").spread_factor)
                extras[f"marginal {sd:g}"] = dict(marginal_kls(mean, cov, jax.random.PRNGKey(5)),
                                                  median_factor=float(np.median(factor)),
                                                  trusted=float(np.mean(factor < 2.0)))
            if structure == "kron" and sd == PRIOR_SDS[0]:
                extras["top_k"] = top_k_scores(post, features_test, yt)
                extras["mc_curve"] = mc_curve(post, features_test, ref)
    return rows, extras


def top_k_scores(posterior, features, labels):
    """Uncertainty-aware top-k on the zero-sum bridge's Dirichlets: how often the list holds the
    true label, its mean length, against top-1 accuracy."""
    mean, cov = logit_gaussian(posterior, features)
    alpha = class_probabilities(mean, cov, "bridge_zero_sum").concentration
    mask = np.asarray(uncertainty_aware_top_k(alpha))
    top1 = float(np.mean(np.asarray(alpha).argmax(1) == labels))
    return dict(contains=float(np.mean(mask[np.arange(len(labels)), labels])), length=float(mask.sum(1).mean()),
                top1=top1)


def mc_curve(posterior, features, ref):
    """KL from the reference of MC with S draws, and of the bridges (thesis Fig. 4.5)."""
    mean, cov = logit_gaussian(posterior, features)
    draws = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
    mc = [kl(ref, class_probabilities(mean, cov, "mc", num_samples=s, rng_key=jax.random.PRNGKey(s)).probabilities)
          for s in draws]
    bridges = {m: kl(ref, class_probabilities(mean, cov, m).probabilities) for m in ("bridge_zero_sum", "probit")}
    return draws, mc, bridges


def plot_mc_curve(curve, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    draws, mc, bridges = curve
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.loglog(draws, mc, "o-", label="MC over the logits")
    for (name, value), style in zip(bridges.items(), ("--", ":")):
        ax.axhline(value, linestyle=style, color="k", label=name)
    ax.set_xlabel("MC draws per input")
    ax.set_ylabel("mean KL from 20 000-draw MC")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def moons_picture(path):
    """Two moons, a ReLU network (its features, and so the logits' variance, grow away from the
    data): the MAP's confidence over the plane against the zero-sum bridge's and LB-norm's
    (thesis Fig. 4.3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.datasets import make_moons

    x, y = make_moons(200, noise=0.1, random_state=0)
    feature_fn, w2, b2 = train_mlp(x, y, 2, hidden=20, activation=jax.nn.relu)
    lll = LastLayerLaplace(feature_fn, w2, b2).fit(x, y)
    g = np.linspace(-3, 4, 120)
    grid = np.stack(np.meshgrid(g, g - 0.5), -1).reshape(-1, 2)
    panels = [("MAP", np.asarray(jax.nn.softmax(feature_fn(grid) @ w2 + b2)).max(1))]
    for method in ("bridge_zero_sum", "lb_norm"):
        panels.append((f"{method} (prior precision {float(lll.posterior.prior_precision):.3g})",
                       np.asarray(lll.predict(grid, method).probabilities).max(1)))
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), sharey=True)
    for ax, (title, conf) in zip(axes, panels):
        im = ax.contourf(g, g - 0.5, conf.reshape(120, 120), levels=np.linspace(0.5, 1, 11), cmap="viridis")
        ax.scatter(*x.T, c=y, s=6, cmap="coolwarm", edgecolors="none")
        ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=axes, label="confidence")
    fig.savefig(path, dpi=120)


def table(rows, out_labels):
    keys = ["accuracy", "nll", "ece", "brier", "kl"] + [f"auroc {label}" for label in out_labels] + ["us"]
    lines = ["| setting | curvature | prior SD | predictive | accuracy | NLL | ECE | Brier | KL to MC(20k) | "
             + " | ".join(f"AUROC {label}" for label in out_labels) + " | us per prediction |",
             "|---|---|---|---|" + "---|" * len(keys)]
    for name, structure, sd, method, scores in rows:
        lines.append(f"| {name} | {structure} | {sd} | {method} | "
                     + " | ".join(f"{scores[k]:.3f}" if k != "us" else f"{scores[k]:.2f}" for k in keys) + " |")
    return lines


def speed_lines(rows):
    """The bridge's speed-up over MC(1000) and its AUROC and KL against MC(1000) and MC(100)."""
    lines = []
    by = {(r[0], r[1], r[2], r[3]): r[4] for r in rows}
    for (name, structure, sd, method), scores in by.items():
        if method != "bridge_zero_sum":
            continue
        mc1000, mc100 = by[(name, structure, sd, "mc1000")], by[(name, structure, sd, "mc100")]
        aurocs = [k for k in scores if k.startswith("auroc")]
        lines.append(f"- {name}, {structure}, prior SD {sd}: the zero-sum bridge {mc1000['us'] / scores['us']:.0f}x "
                     f"faster per prediction than MC(1000); AUROC minus MC(1000)'s: "
                     + ", ".join(f"{k[6:]} {scores[k] - mc1000[k]:+.3f}" for k in aurocs)
                     + f"; KL {scores['kl']:.4f} against MC(100)'s {mc100['kl']:.4f}.")
    return lines


def main():
    x, y, xt, yt = digits()
    rng = np.random.default_rng(1)
    outs_all = {"rotated": rotated(xt), "noise": rng.uniform(0, 1, xt.shape)}
    rows_all, extras = setting("digits", x, y, xt, yt, outs_all, 10)
    low, low_t = y < 5, yt < 5
    rows_low, _ = setting("digits 0-4", x[low], y[low], xt[low_t], yt[low_t], {"5-9": xt[~low_t]}, 5)
    lines = [environment() + f". MLP 64-32-10 (tanh) trained by Adam; last-layer Laplace; {len(x)} training and "
             f"{len(xt)} test images (digits 0-4: {int(low.sum())} and {int(low_t.sum())}, OOD the "
             f"{int((~low_t).sum())} test images of 5-9). KL: mean KL from the {REFERENCE_DRAWS}-draw MC of the same "
             "logit Gaussian. us per prediction: warm, the whole test split in one compiled call including the "
             "logit covariance, best of five.", "", "**digits (all ten classes)**", ""]
    lines += table(rows_all, list(outs_all)) + ["", "**digits 0-4, OOD: 5-9**", ""]
    lines += table(rows_low, ["5-9"]) + ["", "**the bridge against MC**", ""]
    lines += speed_lines(rows_all + rows_low)
    t = extras["top_k"]
    lines += ["", f"**uncertainty-aware top-k** (digits, Kronecker, prior SD 1, threshold 0.05): the list holds the "
              f"true label for {t['contains']:.3f} of the test images (top-1 accuracy {t['top1']:.3f}), mean length "
              f"{t['length']:.3f}."]
    draws, mc, bridges = extras["mc_curve"]
    lines += ["", "**MC draws against the bridge** (digits, Kronecker, prior SD 1; mean KL from MC(20k)): "
              + ", ".join(f"MC({s}) {v:.4f}" for s, v in zip(draws, mc)) + "; "
              + ", ".join(f"{m} {v:.4f}" for m, v in bridges.items()) + ". Plot: `bnn_bridge_mc_draws.png`; two moons: "
              "`bnn_bridge_moons.png`."]
    lines += ["", f"**per-class marginals** (thesis Fig. 4.5's measure, `marginal_kls`: KL from the 20 000-draw "
              f"reference over its 20 equal-mass log-odds bins, per class, {MARGINAL_INPUTS} digits test images, "
              "Kronecker). The spread factor is `bridge_spread_factor` of the zero-sum bridge (1: the Dirichlet is "
              "true to the Gaussian; trusted: below 2).", "",
              "| logit Gaussians | bridge_zero_sum | lb_norm | MC(10) | MC(100) | MC(1000) | median spread factor | "
              "share trusted |", "|---|---|---|---|---|---|---|---|"]
    mean, cov = in_family_gaussians()
    factor = np.asarray(class_probabilities(mean, cov, "bridge_zero_sum").spread_factor)
    control = dict(marginal_kls(mean, cov, jax.random.PRNGKey(5)), median_factor=float(np.median(factor)),
                   trusted=float(np.mean(factor < 2.0)))
    for label, m in [(f"digits, prior SD {sd:g}", extras[f"marginal {sd:g}"]) for sd in PRIOR_SDS] + [
            ("Laplace images of Dirichlets (control)", control)]:
        lines.append(f"| {label} | " + " | ".join(f"{m[k]:.3g}" for k in ("bridge_zero_sum", "lb_norm", "mc10", "mc100",
                                                                            "mc1000", "median_factor"))
                     + f" | {m['trusted']:.2f} |")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    plot_mc_curve(extras["mc_curve"], os.path.join(HERE, "results", "bnn_bridge_mc_draws.png"))
    moons_picture(os.path.join(HERE, "results", "bnn_bridge_moons.png"))
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(HERE, "results", "bnn_bridge.md"), "w") as f:
        f.write(f"<!-- written by benchmarks/bnn_bridge.py on {time.strftime('%Y-%m-%d')}; do not edit -->\n{text}\n")


if __name__ == "__main__":
    main()

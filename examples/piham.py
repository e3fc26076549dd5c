"""
PIHAM on the thesis' synthetic attributed multilayer networks (thesis chapter 5, appendix C).
=============================================================================================

Three parts, every number printed by this script:

1. **C.3, against MTCOV.** N = 500 directed nodes, two Poisson layers (assortative and
   disassortative), one categorical attribute (Z = 3), K = 3, at average degrees 10 and 30;
   5-fold cross-validation. PIHAM (Laplace Matching) and the MTCOV EM baseline side by side:
   held-out edge AUC, attribute accuracy, cosine similarity of the memberships to the truth
   (PIHAM: the Dirichlet means and the softmax of the MAP). ``U`` and ``V`` are relabelled to
   the truth separately: permuting ``V``'s communities together with ``W``'s columns leaves
   every edge's mean unchanged, only the attributes tie the two labellings.
2. **C.4, heterogeneous.** N = 200, a Bernoulli, a Poisson and a Gaussian layer, a
   categorical, a Poisson and a Gaussian attribute: AUC, MAE, RMSE, accuracy per fold.
3. **Memberships' uncertainty against NUTS** on a small C.4 instance (N = 40): the share of
   NUTS's posterior draws inside PIHAM's 90% intervals, interval widths, and each method's
   coverage of the generating memberships; a picture of the memberships with their intervals
   (``examples/piham_memberships.png``). C.4's memberships sit far in the tails of PIHAM's
   ``N(0, 1)`` prior, so not even the exact posterior covers them at 90%;
   ``benchmarks/piham.py`` measures coverage on networks drawn from the prior as well.

Run: ``python examples/piham.py`` (one fold and one degree: about a minute and a half on two
cores; ``--full`` for the thesis' five folds and both degrees, about fifteen minutes). The
picture goes to ``examples/output/piham_memberships.png``.
"""

import os
import sys
import time

import jax
import numpy as np

from numpyro_lm.contrib.networks import attribute_means, edge_means, fit_piham, mtcov_network, piham_model, piham_network
from numpyro_lm.contrib.networks import metrics as M
from numpyro_lm.contrib.networks.model import as_arrays
from numpyro_lm.contrib.networks.mtcov import attribute_probabilities, expected_edges, fit_mtcov

FULL = "--full" in sys.argv
FOLDS = 5 if FULL else 1
# sphinx-gallery runs an example from its own folder and sets no __file__
HERE = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else os.getcwd()
OUTPUT = os.path.join(HERE, "output")
K = 3


def mean_scores(rows):
    return {key: float(np.mean([r[key] for r in rows])) for key in rows[0]}


def c3(average_degree):
    g = mtcov_network(500, K, average_degree, seed=int(average_degree))
    net = g.network
    rows = {"PIHAM": [], "MTCOV": []}
    seconds = {"PIHAM": 0.0, "MTCOV": 0.0}
    for em, am in M.kfold_masks(2, 500, 1, seed=0)[:FOLDS]:
        start = time.perf_counter()
        fit = fit_piham(net, K, edge_mask=em, attribute_mask=am)
        seconds["PIHAM"] += time.perf_counter() - start
        edges = M.edge_scores(net.layers, net.layer_kinds, edge_means(fit.params, net), 1 - em)
        attribute = M.attribute_scores(net.attributes, net.attribute_kinds, attribute_means(fit.params, net), 1 - am)
        rows["PIHAM"].append(dict(
            auc=np.mean([e["auc"] for e in edges]), accuracy=attribute[0]["accuracy"],
            cs_dirichlet=0.5 * (M.cosine_similarity(fit.U.mean, g.u) + M.cosine_similarity(fit.V.mean, g.v)),
            cs_softmax=0.5 * (M.cosine_similarity(fit.U.median, g.u) + M.cosine_similarity(fit.V.median, g.v))))
        start = time.perf_counter()
        mt = fit_mtcov(np.stack(net.layers), net.attributes[0], K, num_categories=3, mask_edges=em > 0,
                       mask_attributes=am[0] > 0, num_restarts=10)
        seconds["MTCOV"] += time.perf_counter() - start
        edges = M.edge_scores(net.layers, net.layer_kinds, expected_edges(mt), 1 - em)
        attribute = M.attribute_scores(net.attributes, net.attribute_kinds, [attribute_probabilities(mt)], 1 - am)
        cs = 0.5 * (M.cosine_similarity(mt.u, g.u) + M.cosine_similarity(mt.v, g.v))
        rows["MTCOV"].append(dict(auc=np.mean([e["auc"] for e in edges]), accuracy=attribute[0]["accuracy"],
                                  cs_dirichlet=cs, cs_softmax=cs))
    for name in rows:
        s = mean_scores(rows[name])
        print(f"  <k> = {average_degree:>2}  {name:<6} AUC {s['auc']:.3f}  attribute accuracy {s['accuracy']:.3f}  "
              f"CS {s['cs_dirichlet']:.3f}" + (f" (softmax of the MAP {s['cs_softmax']:.3f})" if name == "PIHAM" else "")
              + f"  {seconds[name] / FOLDS:.1f} s per fit")


def c4():
    g = piham_network(200, K, seed=0)
    net = g.network
    rows = []
    for em, am in M.kfold_masks(3, 200, 3, seed=0)[:FOLDS]:
        fit = fit_piham(net, K, edge_mask=em, attribute_mask=am)
        e = M.edge_scores(net.layers, net.layer_kinds, edge_means(fit.params, net), 1 - em)
        a = M.attribute_scores(net.attributes, net.attribute_kinds, attribute_means(fit.params, net), 1 - am)
        rows.append(dict(auc_bernoulli=e[0]["auc"], mae_poisson=e[1]["mae"], rmse_gaussian=e[2]["rmse"],
                         accuracy=a[0]["accuracy"], mae_attribute=a[1]["mae"], rmse_attribute=a[2]["rmse"],
                         cs=0.5 * (M.cosine_similarity(fit.U.mean, g.u) + M.cosine_similarity(fit.V.mean, g.v))))
    s = mean_scores(rows)
    print("  " + ", ".join(f"{k} {v:.3f}" for k, v in s.items()))


def against_nuts(path=os.path.join(OUTPUT, "piham_memberships.png")):
    from numpyro.infer import MCMC, NUTS, init_to_value

    g = piham_network(40, K, seed=2)
    fit = fit_piham(g.network, K)
    mcmc = MCMC(NUTS(piham_model, init_strategy=init_to_value(values=fit.params)), num_warmup=500,
                num_samples=1000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), as_arrays(g.network), K)
    draws = mcmc.get_samples()
    for site, mem, truth in (("U", fit.U, g.u), ("V", fit.V, g.v)):
        p = np.asarray(jax.nn.softmax(draws[site], -1))
        lo, hi = np.quantile(p, 0.05, 0), np.quantile(p, 0.95, 0)
        perm = M.align(mem.median, truth)  # NUTS started at the MAP: the same labels
        inside = float(np.mean((p >= np.asarray(mem.lower)) & (p <= np.asarray(mem.upper))))
        print(f"  {site}: NUTS draws inside PIHAM's 90% intervals {inside:.3f}; interval width PIHAM / NUTS (median) "
              f"{float(np.median(np.asarray(mem.upper - mem.lower) / (hi - lo))):.3f}; coverage of the truth: PIHAM "
              f"{M.coverage(mem.lower, mem.upper, truth, perm):.3f}, NUTS {M.coverage(lo, hi, truth, perm):.3f}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, K, figsize=(12, 3.2), sharey=True)
    perm = M.align(fit.U.median, g.u)
    order = np.argsort(g.u.argmax(1), kind="stable")
    p = np.asarray(jax.nn.softmax(draws["U"], -1))
    for k, ax in enumerate(axes):
        j = perm[k]
        x = np.arange(len(order))
        ax.errorbar(x, np.asarray(fit.U.median)[order, j], yerr=[np.asarray(fit.U.median - fit.U.lower)[order, j],
                    np.asarray(fit.U.upper - fit.U.median)[order, j]], fmt="o", ms=3, label="PIHAM (LM, 90%)")
        ax.errorbar(x + 0.3, np.median(p, 0)[order, j], yerr=[np.median(p, 0)[order, j] - np.quantile(p, 0.05, 0)[order, j],
                    np.quantile(p, 0.95, 0)[order, j] - np.median(p, 0)[order, j]], fmt="s", ms=2, alpha=0.6, label="NUTS (90%)")
        ax.plot(x, g.u[order, k], "k.", ms=4, label="truth")
        ax.set_title(f"community {k + 1}: out-going membership", fontsize=9)
        ax.set_xlabel("node (by true group)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"  picture: {path}")


if __name__ == "__main__":
    print("C.3: PIHAM against MTCOV, N = 500, two Poisson layers, one categorical attribute, "
          f"{FOLDS}-fold cross-validation")
    for degree in (10, 30) if FULL else (10,):
        c3(degree)
    print(f"C.4: heterogeneous layers and attributes, N = 200, {FOLDS}-fold cross-validation")
    c4()
    print("Memberships against NUTS (N = 40, 1000 draws after 500 warm-up):")
    against_nuts()

"""PIHAM on the thesis' synthetic networks (thesis chapter 5, appendix C): against MTCOV over
the average degree (Fig. C.1's sweep), time and recovery as N grows (C.4), and the calibration
of the membership intervals against the generating truth and against NUTS.

1. **Degree sweep** (C.3): N = 500 directed nodes, two Poisson layers (assortative and
   disassortative), a categorical attribute (Z = 3), K = 3; average degree 10 to 50, one
   network and one held-out fold (20% of the entries) per degree. PIHAM (``fit_piham``,
   defaults: 10 restarts of 2000 Adam steps) and the MTCOV EM baseline (10 restarts): held-out
   edge AUC, attribute accuracy, cosine similarity (CS) of the memberships to the truth (``U``
   and ``V`` relabelled separately), seconds per fit. ``examples/piham.py --full`` gives five folds
   at degrees 10 and 30.
2. **Size** (C.4): Bernoulli, Poisson and Gaussian layers, categorical, Poisson and Gaussian
   attributes; N = 100 to 1000 with K = 3, and K = 5 at N = 200; one held-out fold: AUC of
   the Bernoulli layer, CS, the covariance path taken and seconds per fit.
3. **Calibration** of the 90% membership intervals:
   (a) networks drawn from PIHAM's own prior (``prior_network``, N = 40, three draws), where
   the exact posterior covers the truth 90% of the time on average: coverage of the truth by
   PIHAM's logistic-normal intervals (the default), by the Dirichlet's Beta intervals, and by
   NUTS's (500 warm-up, 1000 draws, started at the MAP); the share of NUTS's draws inside
   PIHAM's intervals and the width ratio;
   (b) the same on C.4 at N = 40 (memberships far in the prior's tails);
   (c) prior draws at N = 150 with the true ``W`` and ``H`` given: each node's Laplace
   Gaussian from its own Hessian block at the conditional mode, the two kinds of interval
   against the truth. Separates the map from the Gaussian to the simplex (c) from the joint
   Gaussian itself (a).

``python benchmarks/piham.py`` writes ``benchmarks/results/piham.md`` and the tables in
``docs/networks.md``.
"""

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import environment, write_results  # noqa: E402

from numpyro_lm.contrib.networks import (attribute_means, edge_means, fit_piham, memberships, mtcov_network,  # noqa: E402
                                 piham_model, piham_network, prior_network)
from numpyro_lm.contrib.networks import metrics as M  # noqa: E402
from numpyro_lm.contrib.networks.fit import _node_blocks  # noqa: E402
from numpyro_lm.contrib.networks.model import as_arrays, default_masks, log_joint  # noqa: E402
from numpyro_lm.contrib.networks.mtcov import attribute_probabilities, expected_edges, fit_mtcov  # noqa: E402

DEGREES = (10, 20, 30, 40, 50)
SIZES = ((100, 3), (200, 3), (500, 3), (1000, 3), (200, 5))
CREDIBILITY = 0.9


def _cs(inferred_u, inferred_v, g):
    return 0.5 * (M.cosine_similarity(inferred_u, g.u) + M.cosine_similarity(inferred_v, g.v))


def degree_sweep():
    rows = []
    for degree in DEGREES:
        g = mtcov_network(500, 3, degree, seed=degree)
        net = g.network
        em, am = M.kfold_masks(2, 500, 1, seed=0)[0]
        start = time.perf_counter()
        fit = fit_piham(net, 3, edge_mask=em, attribute_mask=am)
        seconds = time.perf_counter() - start
        edges = M.edge_scores(net.layers, net.layer_kinds, edge_means(fit.params, net), 1 - em)
        attribute = M.attribute_scores(net.attributes, net.attribute_kinds, attribute_means(fit.params, net), 1 - am)
        piham = dict(auc=np.mean([e["auc"] for e in edges]), accuracy=attribute[0]["accuracy"],
                     cs=_cs(fit.U.mean, fit.V.mean, g), cs_median=_cs(fit.U.median, fit.V.median, g), seconds=seconds)
        start = time.perf_counter()
        mt = fit_mtcov(np.stack(net.layers), net.attributes[0], 3, num_categories=3, mask_edges=em > 0,
                       mask_attributes=am[0] > 0, num_restarts=10)
        seconds = time.perf_counter() - start
        edges = M.edge_scores(net.layers, net.layer_kinds, expected_edges(mt), 1 - em)
        attribute = M.attribute_scores(net.attributes, net.attribute_kinds, [attribute_probabilities(mt)], 1 - am)
        mtcov = dict(auc=np.mean([e["auc"] for e in edges]), accuracy=attribute[0]["accuracy"], cs=_cs(mt.u, mt.v, g),
                     seconds=seconds)
        rows.append((degree, piham, mtcov))
        print(f"degree {degree}: PIHAM {piham}, MTCOV {mtcov}", flush=True)
    return rows


def sizes():
    rows = []
    for n, k in SIZES:
        g = piham_network(n, k, seed=0)
        net = g.network
        em, am = M.kfold_masks(3, n, 3, seed=0)[0]
        start = time.perf_counter()
        fit = fit_piham(net, k, edge_mask=em, attribute_mask=am)
        seconds = time.perf_counter() - start
        e = M.edge_scores(net.layers, net.layer_kinds, edge_means(fit.params, net), 1 - em)
        rows.append(dict(n=n, k=k, covariance=fit.covariance, auc=e[0]["auc"], cs=_cs(fit.U.mean, fit.V.mean, g),
                         seconds=seconds))
        print(rows[-1], flush=True)
    return rows


def _intervals_against_nuts(g, seed):
    """Coverage of the truth by PIHAM's two kinds of interval and by NUTS; NUTS's draws inside
    PIHAM's default intervals; the median width ratio. ``U`` and ``V`` pooled."""
    from numpyro.infer import MCMC, NUTS, init_to_value

    fit = fit_piham(g.network, 3, seed=seed)
    mcmc = MCMC(NUTS(piham_model, init_strategy=init_to_value(values=fit.params)), num_warmup=500,
                num_samples=1000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed), as_arrays(g.network), 3)
    draws = mcmc.get_samples()
    out = {key: [] for key in ("logistic_normal", "dirichlet", "nuts", "inside", "width")}
    for site, mem, truth in (("U", fit.U, g.u), ("V", fit.V, g.v)):
        beta = memberships(mem.latent_mean, mem.latent_cov, CREDIBILITY, interval="dirichlet")
        p = np.asarray(jax.nn.softmax(draws[site], -1))
        lo, hi = np.quantile(p, 0.05, 0), np.quantile(p, 0.95, 0)
        perm = M.align(mem.median, truth)  # NUTS started at the MAP keeps its labels
        out["logistic_normal"].append(M.coverage(mem.lower, mem.upper, truth, perm))
        out["dirichlet"].append(M.coverage(beta.lower, beta.upper, truth, perm))
        out["nuts"].append(M.coverage(lo, hi, truth, perm))
        out["inside"].append(float(np.mean((p >= np.asarray(mem.lower)) & (p <= np.asarray(mem.upper)))))
        out["width"].append(float(np.median(np.asarray(mem.upper - mem.lower) / (hi - lo))))
    return {key: float(np.mean(value)) for key, value in out.items()}


def _conditional_intervals(g, latents):
    """(c): ``U``, ``V`` at their mode given the true ``W`` and ``H``; per-node Gaussians from
    the Hessian blocks; coverage of the truth by both kinds of interval."""
    net = as_arrays(g.network)
    em, am = default_masks(g.network)
    fixed = {site: jnp.asarray(value) for site, value in latents.items() if site not in ("U", "V")}
    optimiser = optax.adam(optax.cosine_decay_schedule(0.1, 2000, alpha=0.01))

    def loss(uv):
        return -log_joint({**uv, **fixed}, net, em, am)

    @jax.jit
    def mode(uv):
        def step(carry, _):
            p, state = carry
            updates, state = optimiser.update(jax.grad(loss)(p), state, p)
            return (optax.apply_updates(p, updates), state), None

        return jax.lax.scan(step, (uv, optimiser.init(uv)), None, length=2000)[0][0]

    params = {**mode({"U": jnp.asarray(latents["U"]), "V": jnp.asarray(latents["V"])}), **fixed}
    out = {"logistic_normal": [], "dirichlet": []}
    for site, truth in (("U", g.u), ("V", g.v)):
        cov = jnp.linalg.inv(_node_blocks(params, net, em, am, site, True, 1.0))
        for interval in out:
            m = memberships(params[site], cov, CREDIBILITY, interval=interval)
            out[interval].append(M.coverage(m.lower, m.upper, truth, list(range(3))))
    return {key: float(np.mean(value)) for key, value in out.items()}


def calibration():
    prior = [_intervals_against_nuts(prior_network(40, 3, seed=seed)[0], seed) for seed in range(3)]
    c4 = _intervals_against_nuts(piham_network(40, 3, seed=2), 2)
    conditional = [_conditional_intervals(*prior_network(150, 3, seed=seed)) for seed in range(3)]
    print("calibration", prior, c4, conditional, flush=True)
    return prior, c4, conditional


def main():
    sweep, size_rows, (prior, c4, conditional) = degree_sweep(), sizes(), calibration()
    lines = [environment() + ". One network and one held-out fold (20% of the entries) per row; PIHAM: "
             "`fit_piham` defaults (10 restarts of 2000 Adam steps, vmapped); MTCOV: EM, 10 restarts. CS: cosine "
             "similarity of the memberships to the truth, `U` and `V` relabelled separately (PIHAM: Dirichlet means; "
             "in brackets the logistic-normal medians).", "",
             "**C.3 degree sweep** (N = 500, two Poisson layers, categorical attribute, K = 3)", "",
             "| <k> | AUC PIHAM | AUC MTCOV | accuracy PIHAM | accuracy MTCOV | CS PIHAM | CS MTCOV | s PIHAM | s MTCOV |",
             "|---|---|---|---|---|---|---|---|---|"]
    for degree, p, m in sweep:
        lines.append(f"| {degree} | {p['auc']:.3f} | {m['auc']:.3f} | {p['accuracy']:.3f} | {m['accuracy']:.3f} | "
                     f"{p['cs']:.3f} ({p['cs_median']:.3f}) | {m['cs']:.3f} | {p['seconds']:.0f} | {m['seconds']:.0f} |")
    lines += ["", "**C.4 sizes** (Bernoulli, Poisson, Gaussian layers; categorical, Poisson, Gaussian attributes)", "",
              "| N | K | covariance | AUC (Bernoulli layer) | CS | s per fit |", "|---|---|---|---|---|---|"]
    for r in size_rows:
        lines.append(f"| {r['n']} | {r['k']} | {r['covariance']} | {r['auc']:.3f} | {r['cs']:.3f} | {r['seconds']:.0f} |")
    lines += ["", f"**Calibration** of the {CREDIBILITY:.0%} membership intervals (`U` and `V` pooled; NUTS: 500 "
              "warm-up, 1000 draws, started at the MAP)", "",
              "| network | truth covered: PIHAM logistic normal | PIHAM Dirichlet (Beta) | NUTS | NUTS draws inside "
              "PIHAM's intervals | width PIHAM / NUTS |", "|---|---|---|---|---|---|"]
    for seed, r in enumerate(prior):
        lines.append(f"| prior draw {seed}, N = 40 | {r['logistic_normal']:.3f} | {r['dirichlet']:.3f} | {r['nuts']:.3f} "
                     f"| {r['inside']:.3f} | {r['width']:.2f} |")
    lines.append(f"| C.4, N = 40 | {c4['logistic_normal']:.3f} | {c4['dirichlet']:.3f} | {c4['nuts']:.3f} | "
                 f"{c4['inside']:.3f} | {c4['width']:.2f} |")
    lines += ["", "Given the true `W` and `H` (prior draws, N = 150; per-node Gaussians at the conditional mode): truth "
              "covered by the logistic-normal intervals " + ", ".join(f"{r['logistic_normal']:.3f}" for r in conditional)
              + "; by the Dirichlet's Beta intervals " + ", ".join(f"{r['dirichlet']:.3f}" for r in conditional) + "."]
    table = "\n".join(lines)
    print(table)
    write_results("piham", table, "networks.md")


if __name__ == "__main__":
    main()

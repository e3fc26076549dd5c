"""LaplaceNUTS against blackjax's ``laplace_hmc`` over several seeds, where one seed is not enough
to rank them (issue 23).

Both sample the same Laplace marginal of the latent GP classification's lengthscale and
amplitude (``benchmarks/suite.py``; its dense field takes no quadrature), so a difference in
one run's W1/sd (``benchmarks/laplace_nuts.py``) can be Monte Carlo error. Here each runs with
``SEEDS`` seeds (1 chain, 500 warm-up + 1000 draws, as there), scored twice: as there (the
worst W1 / reference SD over the hyperparameters' coordinates, against the long-NUTS run of
the posterior), and against the target both samplers aim at, the Laplace marginal itself,
exact on a grid (two hyperparameters: ``GRID`` x ``GRID`` points over 6 reference SDs each
way in the log basis, ``LaplaceNUTS``'s potential at each; draws by inverse CDF of the cells).
The first row is that grid's own W1/sd: the Laplace approximation's error, which no sampler of
it removes. The table gives each method's mean over the seeds with its standard error, and the
seeds' values.
``python benchmarks/laplace_nuts_seeds.py`` writes ``benchmarks/results/laplace_nuts_seeds.md``
and the table in ``docs/samplers.md``.
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from laplace_nuts import NUM_SAMPLES, _blackjax, _mcmc, _problem, _scores, _split_sites  # noqa: E402
from report import environment, write_results  # noqa: E402

from numpyro_lm import LaplaceNUTS  # noqa: E402

MODEL = "gp_classification_hyper"
SEEDS = 5
GRID, GRID_SDS, GRID_DRAWS = 81, 6.0, 200_000


def laplace_marginal_draws(model, args, kwargs, reference, names):
    """Draws of the exact Laplace marginal of the (two) hyperparameters: its density on a grid in
    the LM (log) basis about the reference, cells drawn by their mass, uniform within a cell."""
    kernel = LaplaceNUTS(model)
    state = kernel.init(jax.random.PRNGKey(0), 10, None, args, kwargs)
    potential = jax.jit(lambda phi: kernel.potential_energy(phi, state.theta_mode))
    axes = [np.linspace(np.log(reference[n]).mean() - GRID_SDS * np.log(reference[n]).std(),
                        np.log(reference[n]).mean() + GRID_SDS * np.log(reference[n]).std(), GRID) for n in names]
    log_density = np.array([[-float(potential(jnp.asarray([a, b], jnp.float32))) for b in axes[1]] for a in axes[0]])
    log_density = np.where(np.isfinite(log_density), log_density, -np.inf)  # a failed inner search: no mass
    mass = np.exp(log_density - log_density.max())
    mass /= mass.sum()
    rng = np.random.default_rng(0)
    cells = np.unravel_index(rng.choice(mass.size, size=GRID_DRAWS, p=mass.ravel()), mass.shape)
    return {n: np.exp(axis[c] + rng.uniform(-0.5, 0.5, c.size) * (axis[1] - axis[0]))
            for n, axis, c in zip(names, axes, cells)}



def _table(own, scores, hyper, theta):
    """The markdown table: the grid's own W1/sd, then each method's mean +- standard error (seeds)."""
    lines = [environment() + f". {MODEL} ({', '.join(hyper)} / {', '.join(theta)}): W1/sd of the hyperparameters "
             f"(worst coordinate; W1 over the SD of what it is measured against) against the long-NUTS reference and "
             f"against the exact Laplace marginal ({GRID} x {GRID} grid), {len(next(iter(scores.values())))} seeds of "
             "1 chain each: mean +- standard error (the seeds).", "",
             "| method | W1/sd to the posterior | W1/sd to the Laplace marginal |", "|---|---|---|",
             f"| the Laplace marginal itself (grid) | {own:.3f} | 0 |"]
    for method, values in scores.items():
        cells = []
        for column in np.asarray(values).T:
            cells.append(f"{column.mean():.3f} +- {column.std(ddof=1) / np.sqrt(len(column)):.3f} "
                         f"({', '.join(f'{v:.2f}' for v in column)})")
        lines.append(f"| {method} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main():
    model, args, kwargs, reference = _problem(MODEL)
    info, theta, hyper = _split_sites(model, args, kwargs)
    target = laplace_marginal_draws(model, args, kwargs, reference, hyper)
    own = _scores(target, {n: reference[n] for n in hyper}, hyper, ())[0]  # the Laplace approximation's own error
    scores = {}
    for method in ("LaplaceNUTS", "blackjax"):
        scores[method] = []
        for seed in range(SEEDS):
            if method == "LaplaceNUTS":
                draws, _ = _mcmc(LaplaceNUTS(model), args, kwargs, NUM_SAMPLES, seeds=(seed,))
            else:
                draws, _ = _blackjax(info, theta, args, kwargs, NUM_SAMPLES, seeds=(seed,))
            scores[method].append((_scores(draws, reference, hyper, ())[0], _scores(draws, target, hyper, ())[0]))
            print(method, seed, scores[method][-1], flush=True)
    table = _table(own, scores, hyper, theta)
    print(table)
    write_results("laplace_nuts_seeds", table, "samplers.md")


if __name__ == "__main__":
    main()

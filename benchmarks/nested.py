"""Nested Laplace (hyper=...) against NUTS on hierarchical models: time and accuracy.

For each model, side by side in one process (float32, 2-core CPU): the nested LM fit
(cold: first call with compilation; warm: median of 5 compiled calls; and warm again for
a fit compiled with XLA's full optimisations, ``compiler_options=None``) against NumPyro
NUTS (1 chain, 1000 warmup + 1000 draws; cold and a second, compiled call), and the
accuracy of the nested and the joint LM fits against the long NUTS reference of
``tests/data`` (worst coordinate: |mean error| in reference SDs, |SD ratio - 1|).
Run with ``python benchmarks/nested.py`` (part of ``make bench``).
"""

import os
import sys
import time
import warnings

import jax
import numpy as np
from numpyro.infer import MCMC, NUTS

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from hierarchical_models import MODELS  # noqa: E402
from report import environment, write_results  # noqa: E402

from numpyro_lm import LaplaceMatching, NotTrustedWarning  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)
HYPER = {"eight_schools": ["tau"], "beta_binomial": ["m", "kappa"], "hierarchical_poisson": ["alpha", "sigma"]}


def timed(fn):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def errors(samples, ref):
    sites = [k[:-5] for k in ref.files if k.endswith("_mean")]
    mean_err = max(float(np.max(np.abs(np.asarray(samples[s]).mean(0) - ref[f"{s}_mean"]) / ref[f"{s}_sd"]))
                   for s in sites if s in samples)
    sd_err = max(float(np.max(np.abs(np.asarray(samples[s]).std(0) / ref[f"{s}_sd"] - 1)))
                 for s in sites if s in samples)
    return mean_err, sd_err


def bench(name):
    model, args, kwargs = MODELS[name]()
    ref = np.load(os.path.join(HERE, "..", "tests", "data", f"{name}_nuts.npz"))
    lm = LaplaceMatching(model, hyper=HYPER[name], num_samples=4000, progress_bar=False)
    cold = timed(lambda: lm.run(jax.random.PRNGKey(0), *args, **kwargs).get_samples())
    warm = np.median([timed(lambda i=i: lm.run(jax.random.PRNGKey(i), *args, **kwargs).get_samples())
                      for i in range(1, 6)])
    nested = errors(lm.get_samples(), ref)
    # the same fit compiled with XLA's full optimisations (compiler_options=None): slower
    # to compile, faster to rerun
    optimised = LaplaceMatching(model, hyper=HYPER[name], num_samples=4000, progress_bar=False, compiler_options=None)
    optimised.run(jax.random.PRNGKey(0), *args, **kwargs)
    warm_opt = np.median([timed(lambda i=i: optimised.run(jax.random.PRNGKey(i), *args, **kwargs).get_samples())
                          for i in range(1, 6)])
    joint = errors(LaplaceMatching(model, num_samples=4000, progress_bar=False, strategy="laplace")
                   .run(jax.random.PRNGKey(0), *args, **kwargs).get_samples(), ref)
    mcmc = MCMC(NUTS(model), num_warmup=1000, num_samples=1000, progress_bar=False, jit_model_args=True)
    nuts_cold = timed(lambda: (mcmc.run(jax.random.PRNGKey(0), *args, **kwargs), mcmc.get_samples())[1])
    nuts_warm = timed(lambda: (mcmc.run(jax.random.PRNGKey(1), *args, **kwargs), mcmc.get_samples())[1])
    return (f"| {name} | {HYPER[name]} | {cold:.2f} | {nuts_cold:.2f} | {nuts_cold / cold:.1f} | {1e3 * warm:.1f} | "
            f"{nuts_warm:.2f} | {nuts_warm / warm:.0f} | {1e3 * warm_opt:.1f} ({nuts_warm / warm_opt:.0f}x) | "
            f"{nested[0]:.3f} / {nested[1]:.3f} | {joint[0]:.2f} / {joint[1]:.2f} |")


def main(names):
    warnings.simplefilter("ignore", NotTrustedWarning)  # the joint fits are scored, not judged
    lines = [
        environment() + ".",
        "",
        "| model | hyper | nested cold s | NUTS cold s | cold x | nested warm ms | NUTS warm s | warm x | "
        "warm ms, compiler_options=None | nested mean err / sd err | joint LM mean err / sd err |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for name in names:
        lines.append(bench(name))
        print(lines[-1], flush=True)
    if set(names) == set(MODELS):  # a partial run does not replace the table
        write_results("nested", "\n".join(lines), "nested.md")


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODELS))

import sys, time, warnings
sys.path.insert(0, "benchmarks")
import jax, jax.numpy as jnp, numpy as np
from inla import poisson_re, poisson_re_data
from numpyro_lm import LaplaceMatching
warnings.simplefilter("ignore")
print("precision", jax.config.jax_default_matmul_precision, flush=True)
for n in (25_000, 100_000):
    x, y = map(jnp.asarray, poisson_re_data(n))
    lm = LaplaceMatching(poisson_re, progress_bar=False)
    for k in range(4):
        t = time.perf_counter(); lm.run(jax.random.PRNGKey(k), x, y=y).get_samples(); d = lm.diagnostics()
        print(n, k, round(time.perf_counter() - t, 2), "khat %.2f" % d["pareto_k"], d["trusted"], {s: round(v, 3) for s, v in d["importance_shift"].items()}, flush=True)

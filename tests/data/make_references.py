"""Long NUTS runs for the nested-Laplace tests, saved as summaries (means and SDs).

Run from the repository root with ``.venv/bin/python tests/data/make_references.py``; it
writes ``tests/data/<model>_nuts.npz`` (4 chains x 5000 draws after 2000 warmup, float64,
seed 0). The models are those of ``tests/hierarchical_models.py``.
"""

import os
import sys

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from hierarchical_models import MODELS  # noqa: E402


def main(names):
    for name in names:
        model, args, kwargs = MODELS[name]()
        mcmc = MCMC(NUTS(model, target_accept_prob=0.95), num_warmup=2000, num_samples=5000, num_chains=4,
                    chain_method="sequential", progress_bar=False)
        mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
        samples = mcmc.get_samples()
        divergences = int(mcmc.get_extra_fields()["diverging"].sum())
        out = {}
        for site, value in samples.items():
            value = np.asarray(value)
            out[f"{site}_mean"] = value.mean(0)
            out[f"{site}_sd"] = value.std(0)
        path = os.path.join(os.path.dirname(__file__), f"{name}_nuts.npz")
        np.savez(path, divergences=divergences, **out)
        print(f"{name}: {divergences} divergences -> {path}")


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODELS))

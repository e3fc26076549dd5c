"""Long NUTS runs for the third-party model corpus (``tests/third_party_models.py``), saved as
summaries: each latent and deterministic site's mean and SD per coordinate (of the quantities
``tests/third_party_summaries.py`` names comparable), the number of divergences and the worst
split R-hat.

Run from the repository root with ``.venv/bin/python tests/data/make_third_party_references.py
[name ...]``; it writes ``tests/data/third_party_nuts.npz`` (4 chains x 2000 draws after 1000
warmup, float32 as users run it, ``target_accept_prob=0.95``, seed 0), merged with the
cases already there. Cases NUTS cannot run (discrete, circular, subsampled, no latent site)
are skipped.
"""

import os
import sys
import warnings

import jax
import numpy as np
from numpyro.diagnostics import split_gelman_rubin
from numpyro.infer import MCMC, NUTS

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from third_party_models import NAMES, case  # noqa: E402
from third_party_common import comparable  # noqa: E402

PATH = os.path.join(os.path.dirname(__file__), "third_party_nuts.npz")
SKIP = {"discrete", "circular", "no_latent"}


def main(names):
    out = dict(np.load(PATH)) if os.path.exists(PATH) else {}
    for name in names:
        c = case(name)
        if c.kind in SKIP:
            continue
        try:
            mcmc = MCMC(NUTS(c.model, target_accept_prob=0.95), num_warmup=1000, num_samples=2000, num_chains=4,
                        chain_method="sequential", progress_bar=False)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mcmc.run(jax.random.PRNGKey(0), *c.args, **c.kwargs)
        except Exception as e:  # noqa: BLE001 - NUTS refuses some cases (subsampling, spheres)
            print(f"{name}: NUTS failed: {type(e).__name__}: {str(e)[:120]}")
            continue
        out = {k: v for k, v in out.items() if not k.startswith(f"{name}/")}  # this case anew
        grouped = mcmc.get_samples(group_by_chain=True)
        chains = [comparable(name, {k: v[c] for k, v in grouped.items()}) for c in range(4)]
        rhat = max(float(np.nanmax(np.asarray(split_gelman_rubin(np.stack([c[k] for c in chains]).astype(float)))))
                   for k in chains[0] if np.size(chains[0][k]))
        divergences = int(mcmc.get_extra_fields()["diverging"].sum())
        for site, value in comparable(name, mcmc.get_samples()).items():
            value = np.asarray(value, np.float64)
            out[f"{name}/{site}/mean"] = value.mean(0)
            out[f"{name}/{site}/sd"] = value.std(0)
        out[f"{name}/divergences"] = np.array(divergences)
        out[f"{name}/rhat"] = np.array(rhat)
        print(f"{name}: {divergences} divergences, worst R-hat {rhat:.3f}", flush=True)
    np.savez(PATH, **out)


if __name__ == "__main__":
    main(sys.argv[1:] or NAMES)

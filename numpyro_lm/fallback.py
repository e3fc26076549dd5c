"""The last rung of the auto-pilot, opt-in: NUTS warm-started from the fit that was not trusted.

``LaplaceMatching(model, fallback="nuts")``: where no candidate of the auto-pilot
(:mod:`numpyro_lm.autopilot`) is trusted, ``run`` runs NUTS from the kept fit
(:func:`numpyro_lm.adapters.warm_nuts`: its mode as the start, its covariance as the first
mass matrix, re-adapted during a :data:`NUM_WARMUP`-step warmup since the fit is known to be
off) and answers with NUTS's draws. Its verdict is NUTS's own: trusted when the split R-hat
of every coordinate is below 1.01, the bulk ESS above :data:`MIN_ESS` and no transition
diverged. The matched families, the Gaussian and the fit's diagnostics stay those of the
approximation it started from (``diagnostics()`` adds ``"nuts"``).
"""

from __future__ import annotations

import time

import jax
import numpy as np
from numpyro.diagnostics import summary
from numpyro.infer import MCMC

from .autopilot import Attempt

__all__ = ["NUM_WARMUP", "MIN_ESS", "NUTSResult", "run_fallback"]

NUM_WARMUP = 500
MIN_ESS = 400


class NUTSResult:
    """NUTS's answer after an untrusted approximation; everything else is the approximation's."""

    def __init__(self, approximation, mcmc: MCMC, seconds: float):
        self.approximation, self.mcmc = approximation, mcmc
        stats = summary(mcmc.get_samples(group_by_chain=True), group_by_chain=True)
        latent = [s.name for s in approximation.info.layout.sites]
        rhat = max(float(np.nanmax(stats[n]["r_hat"])) for n in latent)
        ess = min(float(np.nanmin(stats[n]["n_eff"])) for n in latent)
        divergences = int(np.sum(mcmc.get_extra_fields()["diverging"]))
        reasons = []
        if not rhat < 1.01:
            reasons.append(f"NUTS's split R-hat reaches {rhat:.3f} (>= 1.01)")
        if not ess > MIN_ESS:
            reasons.append(f"NUTS's bulk ESS is {ess:.0f} (<= {MIN_ESS})")
        if divergences:
            reasons.append(f"NUTS had {divergences} divergent transitions")
        self.nuts = {"r_hat": rhat, "ess": ess, "num_divergences": divergences, "num_warmup": NUM_WARMUP}
        self.reasons = tuple(reasons)
        self.trail = list(approximation.trail or []) + [
            Attempt("nuts", not reasons, float("nan"), float("nan"), seconds, self.reasons)]

    def __getattr__(self, name):  # info, args, gaussian, posterior, batch, unpad, ...
        return getattr(self.approximation, name)

    def get_samples(self, num_samples=None, group_by_chain=False, resample=None, rng_key=None) -> dict:
        if resample is not None:
            raise ValueError("resample= reweights an approximation's draws; these draws are NUTS's (fallback='nuts')")
        samples = self.mcmc.get_samples(group_by_chain=group_by_chain)
        if num_samples is not None:
            axis = 1 if group_by_chain else 0
            samples = jax.tree.map(lambda x: jax.lax.slice_in_dim(x, 0, num_samples, axis=axis), samples)
        return samples

    def extra_fields(self, group_by_chain: bool = False) -> dict:
        return self.mcmc.get_extra_fields(group_by_chain=group_by_chain)

    def diagnostics(self) -> dict:
        d = self.approximation.diagnostics()
        trusted = not self.reasons
        d.update(nuts=dict(self.nuts), trusted=trusted, reasons=list(self.reasons),
                 trail=[a._asdict() for a in self.trail],
                 verdict=("trusted: the draws are NUTS's (warm-started from the approximation), R-hat "
                          f"{self.nuts['r_hat']:.3f}, bulk ESS {self.nuts['ess']:.0f}, no divergences." if trusted
                          else "NOT trusted: " + "; ".join(self.reasons) + ". Run longer chains: MCMC(NUTS(model), "
                          "num_warmup=..., num_samples=..., num_chains=4)."))
        return d

    def print_summary(self, prob: float = 0.9, exclude_deterministic: bool = True):
        self.mcmc.print_summary(prob=prob, exclude_deterministic=exclude_deterministic)
        d = self.diagnostics()
        print("Auto-pilot: " + " -> ".join(a.line() for a in self.trail) + f"\n{d['verdict']}")


def run_fallback(lm, approximation, rng_key, args, kwargs) -> NUTSResult:
    """Warm-started NUTS from ``approximation`` (which ``lm`` holds while this runs)."""
    from .adapters import warm_nuts  # the adapters import the facade's modules

    t0 = time.perf_counter()
    warm = warm_nuts(lm, adapt_mass_matrix=True)
    mcmc = MCMC(warm.kernel, num_warmup=NUM_WARMUP, num_samples=lm.num_samples, num_chains=1,
                progress_bar=lm.progress_bar)
    mcmc.run(jax.random.fold_in(rng_key, 7), *args, init_params=warm.init_params, **kwargs)
    return NUTSResult(approximation, mcmc, time.perf_counter() - t0)

"""The last rungs of the auto-pilot, opt-in: sampling from the fit that was not trusted.

``LaplaceMatching(model, fallback="laplace_nuts")``: where no candidate of the auto-pilot
(:mod:`numpyro_lm.approximations.autopilot`) is trusted, ``run`` first runs Laplace-marginal NUTS
(:class:`~numpyro_lm.samplers.laplace_nuts.LaplaceNUTS`: NUTS over the hyperparameters, the latent
field integrated out by Laplace; the model's default split, started at the kept fit's mode),
and where that is not trusted either, or the model has no latent field to integrate out,
NUTS itself as below; the trail shows both.

``LaplaceMatching(model, fallback="nuts")``: where no candidate of the auto-pilot is trusted,
``run`` runs NUTS from the kept fit
(:func:`numpyro_lm.samplers.warm_nuts`: its mode as the start, its covariance as the first
mass matrix, re-adapted during a :data:`NUM_WARMUP`-step warmup since the fit is known to be
off) and answers with NUTS's draws. Its verdict is NUTS's own: trusted when the split R-hat
of every coordinate is below 1.01, the bulk ESS above :data:`MIN_ESS` and no transition
diverged. The matched families, the Gaussian and the fit's diagnostics stay those of the
approximation it started from (``diagnostics()`` adds ``"nuts"``).
"""

from __future__ import annotations

import time
from typing import NamedTuple, Optional

import jax
import numpy as np
from numpyro.diagnostics import summary
from numpyro.infer import MCMC

from ..samplers.laplace_nuts import LaplaceNUTS
from ..samplers.warm_nuts import Fitted, warm_nuts
from .autopilot import Attempt

__all__ = ["NUM_WARMUP", "MIN_ESS", "FALLBACKS", "FallbackOptions", "NUTSResult", "run_fallback"]

FALLBACKS = ("nuts", "laplace_nuts")

NUM_WARMUP = 500
MIN_ESS = 400


class NUTSResult:
    """NUTS's answer after an untrusted approximation; everything else is the approximation's."""

    def __init__(self, approximation, mcmc: MCMC, seconds: float, name: str = "nuts", earlier=()):
        self.approximation, self.mcmc, self.name = approximation, mcmc, name
        stats = summary(mcmc.get_samples(group_by_chain=True), group_by_chain=True)
        latent = [s.name for s in approximation.info.layout.sites]
        rhat = max(float(np.nanmax(stats[n]["r_hat"])) for n in latent)
        ess = min(float(np.nanmin(stats[n]["n_eff"])) for n in latent)
        divergences = int(np.sum(mcmc.get_extra_fields()["diverging"]))
        reasons = []
        who = "Laplace-marginal NUTS" if name == "laplace_nuts" else "NUTS"
        if not rhat < 1.01:
            reasons.append(f"{who}'s split R-hat reaches {rhat:.3f} (>= 1.01)")
        if not ess > MIN_ESS:
            reasons.append(f"{who}'s bulk ESS is {ess:.0f} (<= {MIN_ESS})")
        if divergences:
            reasons.append(f"{who} had {divergences} divergent transitions")
        self.nuts = {"r_hat": rhat, "ess": ess, "num_divergences": divergences, "num_warmup": NUM_WARMUP}
        if name == "laplace_nuts":  # which sites NUTS sampled and which Laplace integrated out
            self.nuts["sampled"], self.nuts["marginalized"] = mcmc.sampler.split
        self.reasons = tuple(reasons)
        self.trail = list(approximation.trail or []) + list(earlier) + [
            Attempt(name, not reasons, float("nan"), float("nan"), seconds, self.reasons)]

    def __getattr__(self, name):  # info, args, gaussian, posterior, batch, unpad, ...
        return getattr(self.approximation, name)

    def get_samples(self, num_samples=None, group_by_chain=False, resample=None, rng_key=None) -> dict:
        if resample is not None:
            raise ValueError(f"resample= reweights an approximation's draws; these draws are NUTS's "
                             f"(fallback={self.name!r})")
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
                 verdict=(f"trusted: the draws are {'Laplace-marginal ' if self.name == 'laplace_nuts' else ''}"
                          f"NUTS's ({self._split_words()}warm-started from the approximation), R-hat "
                          f"{self.nuts['r_hat']:.3f}, bulk ESS {self.nuts['ess']:.0f}, no divergences." if trusted
                          else "NOT trusted: " + "; ".join(self.reasons) + ". Run longer chains: MCMC(NUTS(model), "
                          "num_warmup=..., num_samples=..., num_chains=4)."))
        return d

    def _split_words(self) -> str:
        if "marginalized" not in self.nuts:
            return ""
        return f"NUTS over {self.nuts['sampled']}, Laplace over {self.nuts['marginalized']}; "

    def print_summary(self, prob: float = 0.9, exclude_deterministic: bool = True):
        self.mcmc.print_summary(prob=prob, exclude_deterministic=exclude_deterministic)
        d = self.diagnostics()
        print("Auto-pilot: " + " -> ".join(a.line() for a in self.trail) + f"\n{d['verdict']}")


class FallbackOptions(NamedTuple):
    """What the fallback takes of ``LaplaceMatching``'s options: its model, bases and families
    (for Laplace-marginal NUTS), the number of draws and the progress bar."""

    model: object
    bases: Optional[dict] = None
    families: Optional[dict] = None
    num_samples: int = 1000
    progress_bar: bool = True


def _chain(kernel, options: FallbackOptions) -> MCMC:
    """One chain of ``num_samples`` draws after :data:`NUM_WARMUP` warm-up steps."""
    return MCMC(kernel, num_warmup=NUM_WARMUP, num_samples=options.num_samples, num_chains=1,
                progress_bar=options.progress_bar)


def run_fallback(options: FallbackOptions, approximation, rng_key, args, kwargs, kind: str = "nuts") -> NUTSResult:
    """The fallback ``kind`` (:data:`FALLBACKS`) from ``approximation``: for ``"laplace_nuts"``
    Laplace-marginal NUTS first, then NUTS where it is refused or not trusted (module docstring)."""
    earlier = []
    if kind == "laplace_nuts":
        result = _laplace_nuts(options, approximation, rng_key, args, kwargs)
        if isinstance(result, NUTSResult) and not result.reasons:
            return result
        earlier = [result] if isinstance(result, Attempt) else result.trail[len(approximation.trail or []):]
    t0 = time.perf_counter()
    warm = warm_nuts(Fitted(options.model, approximation.info, approximation.gaussian, approximation.args,
                            approximation.kwargs, approximation.compiler_options), adapt_mass_matrix=True)
    mcmc = _chain(warm.kernel, options)
    mcmc.run(jax.random.fold_in(rng_key, 7), *args, init_params=warm.init_params, **kwargs)
    return NUTSResult(approximation, mcmc, time.perf_counter() - t0, earlier=earlier)


def _laplace_nuts(options: FallbackOptions, approximation, rng_key, args, kwargs):
    """A trusted or untrusted :class:`NUTSResult` of Laplace-marginal NUTS, or the
    :class:`~numpyro_lm.approximations.autopilot.Attempt` that says why it could not run."""
    t0 = time.perf_counter()
    try:
        mcmc = _chain(LaplaceNUTS(options.model, bases=options.bases, families=options.families), options)
        mcmc.run(jax.random.fold_in(rng_key, 8), *args, init_params=approximation.gaussian.mean, **kwargs)
    except (ValueError, FloatingPointError) as error:  # no latent field, or no conditional mode at the start
        return Attempt("laplace_nuts", False, float("nan"), float("nan"), time.perf_counter() - t0,
                       (str(error).split(". ")[0],))
    return NUTSResult(approximation, mcmc, time.perf_counter() - t0, name="laplace_nuts")

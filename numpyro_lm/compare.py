"""``compare``: LM, NUTS and elliptical slice sampling on the same model, side by side.

Each method runs on the same arguments in this process and is timed end to end (its
compilation included, as a user would wait for it). The table reports per method the
wall time, NUTS's time divided by it (how many times faster than NUTS), and the worst
coordinate's error in mean and standard deviation against a *reference*: the method that
ran longest, unless one is named. The draws come back as ArviZ ``InferenceData``.
"""

from __future__ import annotations

import time
from typing import NamedTuple, Optional, Sequence

import jax
import numpy as np
from numpyro.infer import MCMC, NUTS

from .checks.validation import check_model, check_rng_key
from .matching import LaplaceMatching
from .samplers import EllipticalSlice, warm_nuts

__all__ = ["Comparison", "compare", "METHODS"]

METHODS = ("lm", "nuts", "warm_nuts", "ess")


class Comparison(NamedTuple):
    """``table``: a pandas DataFrame, one row per method; ``inference_data``: ``{method: InferenceData}``."""

    table: object
    inference_data: dict


def _flat(idata, names):
    post = idata.posterior
    cols = [np.asarray(post[n].values).reshape(post.sizes["chain"] * post.sizes["draw"], -1) for n in names]
    return np.concatenate(cols, axis=1)


def _ellipse_from_model(model, args, kwargs) -> bool:
    """Whether every latent site has a fixed Gaussian prior (ESS can use the model's own)."""
    try:
        EllipticalSlice(model)._model_setup(jax.random.PRNGKey(0), args, kwargs)
        return True
    except ValueError:
        return False


def compare(
    model,
    *args,
    methods: Sequence[str] = ("lm", "nuts", "ess"),
    rng_key=None,
    num_samples: int = 1000,
    num_warmup: int = 1000,
    warm_num_warmup: int = 150,
    num_chains: int = 1,
    reference: Optional[str] = None,
    progress_bar: bool = False,
    lm_kwargs: Optional[dict] = None,
    **kwargs,
) -> Comparison:
    """Run each of ``methods`` on ``model(*args, **kwargs)`` and compare them.

    :param methods: any of ``"lm"`` (:class:`~numpyro_lm.LaplaceMatching`), ``"nuts"``
        (NumPyro NUTS, ``num_warmup`` + ``num_samples``), ``"warm_nuts"`` (NUTS started from
        the LM fit, :func:`~numpyro_lm.samplers.warm_nuts`, ``warm_num_warmup`` warmup steps)
        and ``"ess"`` (:class:`~numpyro_lm.samplers.EllipticalSlice`: the model's own
        Gaussian prior as the ellipse where every latent site has one, else the LM
        Gaussian; ``num_warmup`` + ``num_samples``).
    :param str reference: the method whose draws are the truth; default the one that ran
        longest (usually the most converged).
    :param dict lm_kwargs: options of :class:`~numpyro_lm.LaplaceMatching`.
    :returns: :class:`Comparison` ``(table, inference_data)``; the table's columns are
        ``wall_s``, ``x_faster_than_nuts``, ``max_mean_error_sd`` (``|mean - ref mean| /
        ref sd``, worst coordinate), ``max_sd_error`` (``|sd / ref sd - 1|``, worst) and
        ``pareto_k`` (LM only).
    """
    import pandas as pd

    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; choose from {list(METHODS)}")
    check_model(model)
    if rng_key is not None:
        check_rng_key(rng_key)
    key = jax.random.PRNGKey(0) if rng_key is None else rng_key
    lm_kwargs = {"num_samples": num_samples * num_chains, "progress_bar": progress_bar, **(lm_kwargs or {})}
    run = _Runs(model, args, kwargs, key, lm_kwargs, num_warmup, warm_num_warmup, num_chains,
                dict(num_samples=num_samples, num_chains=num_chains, chain_method="sequential",
                     progress_bar=progress_bar))
    idata, seconds, khat = {}, {}, {}
    for method in methods:
        seconds[method], idata[method], khat[method] = run(method)
    ref = reference or max(seconds, key=seconds.get)
    if ref not in idata:
        raise ValueError(f"reference {ref!r} is not among the methods run {list(methods)}")
    return Comparison(pd.DataFrame(_rows(methods, idata, seconds, khat, ref)).set_index("method"), idata)


class _Runs:
    """Runs one method on the model: ``(seconds until its draws are ready, InferenceData, k-hat or
    NaN)``. The LM fit is made once and shared (``warm_nuts`` and ``ess`` start from it): its time
    counts where it is made."""

    def __init__(self, model, args, kwargs, key, lm_kwargs, num_warmup, warm_num_warmup, num_chains, mcmc_options):
        self.model, self.args, self.kwargs, self.key, self.lm_kwargs = model, args, kwargs, key, lm_kwargs
        self.num_warmup, self.warm_num_warmup, self.num_chains = num_warmup, warm_num_warmup, num_chains
        self.mcmc_options, self.fitted = mcmc_options, None

    def lm(self) -> LaplaceMatching:
        if self.fitted is None:
            self.fitted = LaplaceMatching(self.model, **self.lm_kwargs).run(self.key, *self.args, **self.kwargs)
        return self.fitted

    def __call__(self, method: str):
        import arviz as az

        t0 = time.perf_counter()
        if method == "lm":
            lm = self.lm()
            jax.block_until_ready(lm.get_samples())
            seconds = time.perf_counter() - t0
            return seconds, lm.to_inference_data(log_likelihood=False), lm.diagnostics()["pareto_k"]
        init = {}
        if method == "nuts":
            kernel, num_warmup = NUTS(self.model), self.num_warmup
        elif method == "warm_nuts":
            warm = warm_nuts(self.lm())  # counted: the warm start includes the LM fit
            kernel, num_warmup = warm.kernel, self.warm_num_warmup
            init = {"init_params": {k: np.broadcast_to(v, (self.num_chains,) + v.shape) if self.num_chains > 1 else v
                                    for k, v in warm.init_params.items()}}
        else:  # ess: the model's own Gaussian prior where every latent site has one, else the LM Gaussian
            model_prior = _ellipse_from_model(self.model, self.args, self.kwargs)
            kernel = EllipticalSlice(self.model) if model_prior else EllipticalSlice.from_laplace(self.lm())
            num_warmup = self.num_warmup
        mcmc = MCMC(kernel, num_warmup=num_warmup, **self.mcmc_options)
        mcmc.run(self.key, *self.args, **init, **self.kwargs)
        jax.block_until_ready(mcmc.get_samples())
        return time.perf_counter() - t0, az.from_numpyro(mcmc, log_likelihood=False), np.nan


def _rows(methods, idata, seconds, khat, ref) -> list:
    """The table's rows: time, speed-up over NUTS and the worst coordinate's errors against ``ref``."""
    names = [n for n in idata[ref].posterior.data_vars if all(n in d.posterior for d in idata.values())]
    ref_flat = _flat(idata[ref], names)
    ref_mean, ref_sd = ref_flat.mean(0), ref_flat.std(0)
    rows = []
    for method in methods:
        flat = _flat(idata[method], names)
        rows.append({
            "method": method,
            "wall_s": seconds[method],
            "x_faster_than_nuts": seconds["nuts"] / seconds[method] if "nuts" in seconds else np.nan,
            "max_mean_error_sd": float(np.max(np.abs(flat.mean(0) - ref_mean) / ref_sd)),
            "max_sd_error": float(np.max(np.abs(flat.std(0) / ref_sd - 1.0))),
            "pareto_k": khat.get(method, np.nan),
            "reference": method == ref,
        })
    return rows

"""``LaplaceMatching``: the one stateful object, used like :class:`numpyro.infer.MCMC`.

.. code-block:: python

    lm = LaplaceMatching(model).run(jax.random.PRNGKey(0), *args, **kwargs)
    lm.get_samples(); lm.print_summary(); lm.posterior["tau"]  # a Gamma
    many = LaplaceMatching(model).run_many(key, *batched_args)  # B data sets in one program

It maps options to the pure core and keeps the traced models and the last result. Data
flow: :func:`~numpyro_lm.core.model.model_info` (sites, bases, flat log density) ->
:mod:`~numpyro_lm.approximations.joint_fit` (Newton mode search, :class:`~numpyro_lm.mode.laplace_state.LaplaceState` with a
:mod:`~numpyro_lm.curvature`, MVI refinement, matched families) or :mod:`~numpyro_lm.approximations.nested`
-> :class:`~numpyro_lm.approximations.result.Result` (copula draws, PSIS, matched posterior, diagnostics)
-> ArviZ. References: Hobbhahn and Hennig, "Laplace Matching for fast Approximate Inference
in Latent Gaussian Models", arXiv:2105.03109 (2021); Hobbhahn, "Laplace Matching and the
Laplace Bridge", thesis (2021).
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional

import jax
import numpy as np

from .approximations.across_processes import GATHER
from .approximations.options import Options, checked_options
from .checks.data import ObservedDataError
from .checks.errors import NotPositiveDefiniteError
from .checks.validation import check_count, check_init_params, check_model, check_rng_key, refuse_mcmc_options
from .checks.verdict import NotTrustedWarning
from .core.model import ModelInfo, TracedModels
from .inference_data import to_inference_data
from .runtime.batch import batch_of
from .runtime.compilation_cache import use_compilation_cache
from .runtime.placement import fit_device, placed
from .runtime.programs import BATCH_COMPILE, FAST_COMPILE, on_device, split_inputs
from .runtime.random import num_pseudo_chains
from .runtime.static_data import needs_concrete

__all__ = ["LaplaceMatching", "NotPositiveDefiniteError", "FAST_COMPILE", "BATCH_COMPILE"]


class LaplaceMatching:
    r"""Laplace Matching posterior of a NumPyro model, used like :class:`numpyro.infer.MCMC`.

    Each latent site moves to its Laplace Matching basis (log for positive, logit for
    intervals, softmax over zero-sum logits for the simplex, matrix log for positive
    definite, identity for real; numpyro's ``biject_to`` otherwise). The joint mode of
    :math:`\log p(x(y), \text{data}) + \log|\det \partial x/\partial y|` over the basis
    coordinates ``y`` and the negative Hessian ``H`` there give :math:`N(y^*, H^{-1})`; each
    site's Gaussian marginal is mapped in closed form to its matched family (exact on
    conjugate models: Gamma-Poisson, Beta-Binomial, Dirichlet-Multinomial, Normal-Normal).

    :param model: a NumPyro model.
    :param int num_samples: draws returned by :meth:`get_samples` (``run`` makes them with the
        fit, ``run_many`` on request).
    :param dict bases: per-site basis, e.g. ``{"sigma": "sqrt"}`` (:func:`numpyro_lm.families.bases.basis_names`).
    :param dict families: per-site family, e.g. ``{"tau": "gaussian"}`` (:func:`numpyro_lm.families.family_names`).
    :param init_strategy: a numpyro init strategy. ``None`` (default) starts at the basis
        origin (real sites 0, positive ones 1, simplices uniform...), falling back to
        ``init_to_uniform`` where the density is not finite there.
    :param str method: ``"newton"``, ``"lbfgs"`` (an L-BFGS warm start, then Newton) or
        ``"auto"`` (Newton up to ``newton_max_dim`` coordinates).
    :param float tol: Newton decrement :math:`\sqrt{g^\top H^{-1} g}` at convergence, in
        posterior SDs (default 1e-9 in float64, 1e-3 in float32).
    :param int max_iter: Newton evaluations of the mode search.
    :param float regularize: opt-in ridge :math:`H + rI` for a Hessian that is not positive
        definite; changes the posterior (prefer float64 or a proper prior).
    :param bool progress_bar: a progress bar when the mode search runs past two seconds.
    :param int newton_max_dim: largest dimension for which ``method="auto"`` picks Newton.
    :param str refine: MVI refinement of the Gaussian before matching (:mod:`numpyro_lm.posterior.refine`):
        ``"dadvi"`` (300 fixed draws, Newton: two to three times a plain fit's cost), or ``"mean"``,
        ``"eig"``, ``"lowrank"``, ``"diag"`` (1000 fixed draws, L-BFGS); the bound before and
        after is in :meth:`diagnostics`. ``refine_num_samples`` fixed draws (default: the
        method's), ``refine_max_iter`` optimiser steps. Refinement uses the dense curvature
        (its eigenbasis), whatever D: a model too large for it is refused before allocation.
    :param hyper: nested Laplace (:mod:`numpyro_lm.approximations.nested`, INLA style) over these sites
        (at most ten coordinates), or ``"auto"``: the model's hyperparameters
        (:func:`numpyro_lm.core.structure.hyper_sites`: global scales and shapes that set another
        latent site's prior or enter a likelihood with other latent sites). No joint fit is made.
    :param str strategy: ``"auto"`` (default): the first trusted of nested Laplace (where
        the model has hyperparameters), joint Laplace Matching and PSIS-corrected moments
        (:mod:`numpyro_lm.approximations.autopilot`; the attempts are in ``diagnostics()["trail"]``);
        ``"laplace"``: the joint fit alone. Explicit ``refine=`` or ``hyper=`` choose for you.
    :param str fallback: ``"nuts"``: where the answer is not trusted, run NUTS warm-started
        from it and answer with NUTS's draws (:mod:`numpyro_lm.approximations.fallback`); ``"laplace_nuts"``:
        Laplace-marginal NUTS (:class:`~numpyro_lm.LaplaceNUTS`) first, then NUTS where that is
        refused or not trusted. Default ``None``:
        ``run`` warns instead, naming that call.
    :param int num_starts: joint mode searches (one program): from the initial point and
        from ``num_starts - 1`` points spread over (-2, 2) in the LM basis
        (:func:`numpyro_lm.core.starts.spread_points`). The highest density is kept; a second mode
        of comparable Laplace mass makes the fit untrusted (``diagnostics()["reasons"]``).
        Default ``None``: :data:`~numpyro_lm.core.starts.DEFAULT_STARTS` for models of at most
        :data:`~numpyro_lm.core.starts.MULTI_START_MAX_DIM` coordinates, else one. Single fits only.
    :param str curvature: how the mode search holds the Hessian (:mod:`numpyro_lm.mode.hessian`):
        ``"dense"`` (``D x D``), ``"arrowhead"`` (the block-arrowhead structure of a plate's
        local sites and the global ones: ``O(D)`` time and memory, checked on a random probe at
        every step), ``"lowrank"`` (the prior's block-arrowhead Hessian plus a low-rank update
        of about the number of observations: a regression with more coefficients than data,
        ``O(D m)``) or ``"auto"`` (default): above
        :data:`~numpyro_lm.mode.hessian.ARROWHEAD_MIN_DIM` coordinates the arrowhead where a plate
        gives one, then the low-rank update where the observations are few, each tried where
        the one before does not hold; else dense. A dense curvature that would not fit in
        memory is refused before it is allocated.
    :param str plate: the plate of ``curvature="arrowhead"`` (default: the plate holding the most
        latent coordinates).
    :param options: none: ``MCMC``'s own options (``num_warmup``, ``num_chains``,
        ``thinning``, ...) are refused with the reason
        (:data:`~numpyro_lm.checks.validation.MCMC_ONLY_OPTIONS`), others as unexpected.
    :param dict compiler_options: XLA options of the compiled programs. The default,
        ``"auto"``, is ``FAST_COMPILE`` (faster to compile, at about the same speed, for dense
        fits of small models) below
        :data:`~numpyro_lm.runtime.programs.LARGE_MODEL` latent and observed numbers and
        ``BATCH_COMPILE`` (LLVM's optimisations, XLA:CPU's elemental emitters) above, for a nested
        fit's inner fits from 1000 such numbers, and for the draws and the verdict's weights where they evaluate
        :data:`~numpyro_lm.runtime.programs.HEAVY_PROGRAM` numbers or more. ``BATCH_COMPILE``
        also suits expensive log densities and many refits; ``None``: XLA's defaults.
    :param device: where the fit runs (:mod:`numpyro_lm.runtime.placement`): ``"auto"`` (default) the
        host CPU for small models even where an accelerator is JAX's default device, else the default
        device; ``"cpu"``, ``"default"`` or a :class:`jax.Device`.
    """

    def __init__(self, model: Callable, *, num_samples: int = 1000, bases: Optional[dict] = None,
                 families: Optional[dict] = None, init_strategy: Optional[Callable] = None, method: str = "auto",
                 tol: Optional[float] = None, max_iter: int = 200, regularize: Optional[float] = None,
                 newton_max_dim: int = 1000, progress_bar: bool = True, refine: Optional[str] = None, hyper=None,
                 refine_num_samples: Optional[int] = None, refine_max_iter: int = 200,
                 compiler_options="auto", num_starts: Optional[int] = None, strategy: str = "auto",
                 fallback: Optional[str] = None, curvature: str = "auto", plate: Optional[str] = None,
                 device="auto", **options):
        refuse_mcmc_options(options)
        check_model(model)
        self.options = checked_options(
            num_samples=num_samples, bases=bases, families=families, init_strategy=init_strategy, method=method,
            tol=tol, max_iter=max_iter, regularize=regularize, newton_max_dim=newton_max_dim,
            progress_bar=progress_bar, refine=refine, hyper=hyper, refine_num_samples=refine_num_samples,
            refine_max_iter=refine_max_iter, compiler_options=compiler_options, num_starts=num_starts,
            strategy=strategy, fallback=fallback, curvature=curvature, plate=plate, device=device)
        self.model = model
        self._traced, self._result, self._given = TracedModels(model, self.options.bases, self.options.families), None, None

    def __getattr__(self, name):  # the options as attributes, as MCMC has them (lm.num_samples, lm.progress_bar)
        if name != "options" and name in Options._fields:
            return getattr(self.options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------------- fitting

    def run(self, rng_key, *args, init_params: Optional[dict] = None, **kwargs) -> "LaplaceMatching":
        """Find the mode, the curvature and the matched posterior (draws come on request).

        :param rng_key: PRNG key (init strategy, refinement, draws).
        :param args, kwargs: the model's arguments. Arrays are traced (a second call with
            the same shapes reuses the compiled programs); other values are static.
        :param dict init_params: initial *constrained* values per site.
        """
        check_rng_key(rng_key)
        use_compilation_cache()  # a second process of the same script starts warm (runtime.compilation_cache)
        args, kwargs, info = self._traced.inputs(args, kwargs)
        given = (args, kwargs)  # model_args / model_kwargs: as the user passed them, not the device copies
        check_init_params(init_params, info.layout)
        with placed(device := fit_device(self.options.device, info.size + info.layout.observed_size)):
            args, kwargs = on_device(args, kwargs, device)
            result = self.options.fit(self.model, info, rng_key, args, kwargs, init_params)
            diagnostics = result.diagnostics()  # before the object changes: a failed call leaves it as it was
        self._result, self._given = result, given  # only a fit that passed its checks replaces the last one
        if not diagnostics["trusted"]:  # silence is not an answer
            warnings.warn(f"LaplaceMatching: {diagnostics['verdict']}", NotTrustedWarning, stacklevel=2)
        return self

    def run_many(self, rng_key, *args, init_params: Optional[dict] = None, on_failure: str = "raise",
                 devices=None, batch_axes: Optional[tuple] = None, compiler_options: Optional[dict] = BATCH_COMPILE,
                 gather: str = "all", **kwargs) -> "LaplaceMatching":
        """Fit B data sets of the model in one compiled, vmapped program.

        Every array argument carries a leading batch axis of size B (other arguments are
        shared); ``init_params`` too. Afterwards :meth:`get_samples` returns arrays of shape
        ``(B, num_samples, ...)``, ``posterior[site]`` has batch shape ``(B, ...)`` and
        :meth:`diagnostics` per-data-set arrays. With several devices (``devices``, default
        ``jax.local_devices()``) the batch is split across them with ``jax.shard_map``.

        :param str on_failure: ``"raise"`` the first failed data set's error (naming it), or
            ``"warn"``: keep the other fits (a failed one's results are not finite).
        :param tuple batch_axes: which array arguments (in ``jax.tree`` order of ``(args,
            kwargs)``) are batched; default all.
        :param dict compiler_options: XLA options of the batch's programs (fit, draws,
            weights). The default, ``BATCH_COMPILE``, keeps LLVM's optimisations on: a
            batch's run time grows with B, its compile time does not (``benchmarks/batch.py``
            measures batches).
        :param str gather: under ``jax.distributed`` each process fits its share of the same batch
            (:mod:`numpyro_lm.approximations.across_processes`); then ``"all"`` (default): each holds
            every data set's results, ``"local"``: its own share's (:attr:`batch_indices`).
        """
        check_rng_key(rng_key)
        if self.hyper is not None:  # refused before any work
            raise ValueError("run_many fits joint Laplace approximations; nested fits (hyper=) are not batched "
                             "yet: call run() per data set.")
        if on_failure not in ("raise", "warn"):
            raise ValueError(f'on_failure must be "raise" or "warn", not {on_failure!r}')
        if gather not in GATHER:
            raise ValueError(f'gather must be "all" or "local", not {gather!r}')
        use_compilation_cache()
        batch = batch_of(args, kwargs, batch_axes, devices)
        info = _batch_info(self._traced, args, kwargs, batch)
        self._result = self.options.fit_many(info, batch, rng_key, args, kwargs, init_params, compiler_options,
                                             on_failure, gather, devices_given=devices is not None)
        return self

    # ------------------------------------------------------------------- results

    def _require(self):
        if self._result is None:
            raise RuntimeError("call run() first")
        return self._result

    def get_samples(self, num_samples: Optional[int] = None, group_by_chain: bool = False,
                    resample: Optional[str] = None, rng_key=None) -> dict:
        r"""Constrained joint draws ``{site: array}``, as :meth:`numpyro.infer.MCMC.get_samples`.

        Each latent coordinate follows its matched family and coordinates keep the Laplace
        correlations (Gaussian copula, :mod:`numpyro_lm.posterior.copula`). ``num_samples``: another
        number of draws from the same key (the first ones are shared). ``resample="psis"``:
        Pareto smoothed importance resampling towards the posterior (refused where k-hat >
        0.7). After :meth:`run_many` every array has a leading axis of size B.
        """
        check_count(num_samples, "num_samples", allow_none=True)
        return self._require().get_samples(num_samples, group_by_chain, resample, rng_key)

    def get_extra_fields(self, group_by_chain: bool = False) -> dict:
        """Per draw: ``lp`` (log density in the LM basis), ``log_q`` (the approximation's) and
        ``log_weight = lp - log_q`` (constant where the approximation is exact)."""
        return self._require().extra_fields(group_by_chain)

    def diagnostics(self) -> dict:
        """How far the fit can be trusted: the mode search, the curvature's spectrum, and PSIS
        of the draws (``pareto_k`` below 0.5 good, up to 0.7 usable with ``resample="psis"``,
        above 0.7 the approximation misses the posterior), ``verdict`` in words. Per-data-set
        arrays after :meth:`run_many`."""
        return self._require().diagnostics()

    def print_summary(self, prob: float = 0.9, exclude_deterministic: bool = True):
        """Mean, sd, quantiles, n_eff and r_hat per site as MCMC prints them, then the fit's
        diagnostics (n_eff and r_hat check the draws, not the approximation)."""
        self._require().print_summary(prob, exclude_deterministic)

    def to_inference_data(self, **kwargs):
        """ArviZ ``InferenceData`` (:func:`numpyro_lm.inference_data.to_inference_data`);
        ``az.from_numpyro(lm)`` gives the same posterior, sample_stats and log_likelihood."""
        self._require()
        return to_inference_data(self, **kwargs)

    @property
    def num_chains(self) -> int:
        """The pseudo-chains the independent draws are grouped into
        (:func:`numpyro_lm.runtime.random.num_pseudo_chains`): ``get_samples(group_by_chain=True)``
        has this leading axis, and ``az.from_numpyro`` reads it as MCMC's. A fit the
        auto-pilot handed to NUTS has NUTS's one chain."""
        if self._fell_back_to_nuts():
            return self._result.mcmc.num_chains
        return num_pseudo_chains(self.num_samples)

    @property
    def thinning(self) -> int:
        """For ``az.from_numpyro``, which takes ``num_samples // thinning`` draws per chain
        (MCMC's ``num_samples`` counts per chain, LM's counts all draws): ``num_chains``.
        Nothing is thinned."""
        return 1 if self._fell_back_to_nuts() else self.num_chains

    def _fell_back_to_nuts(self) -> bool:
        return self._result is not None and hasattr(self._result, "mcmc")

    @property
    def posterior(self):
        """``{site: Distribution}``: each site's matched family on its own domain."""
        return self._require().posterior

    @property
    def gaussian(self):
        """The Gaussian over the flat basis coordinates (:class:`numpyro_lm.curvature.Gaussian`)."""
        return self._result_part(self._require().gaussian)

    @property
    def state(self):
        """The :class:`~numpyro_lm.mode.laplace_state.LaplaceState` of a joint fit (``None`` for a nested one)."""
        return self._result_part(getattr(self._require(), "state", None))

    @property
    def model_info(self) -> ModelInfo:
        """The traced model (:class:`~numpyro_lm.core.model.ModelInfo`)."""
        return self._require().info

    @property
    def layout(self):
        """The latent sites, their bases, families and places in the flat vector."""
        return self.model_info.layout

    @property
    def design(self):
        """The nested Laplace design (:class:`~numpyro_lm.approximations.nested.NestedDesign`), or ``None``."""
        return getattr(self._require(), "design", None)

    @property
    def batch_size(self) -> Optional[int]:
        """B after :meth:`run_many`, ``None`` after :meth:`run`."""
        batch = self._require().batch
        return None if batch is None else batch.size

    @property
    def batch_indices(self) -> Optional[np.ndarray]:
        """The data sets held, in order: all, or this process's share after ``run_many(..., gather="local")``
        across processes; ``None`` after :meth:`run`."""
        batch = self._require().batch
        return None if batch is None else np.arange(batch.offset, batch.offset + batch.size)

    @property
    def model_args(self) -> tuple:
        """The model's positional arguments of the last fit (as passed to :meth:`run`)."""
        result = self._require()
        return result.args if result.batch is not None or self._given is None else tuple(self._given[0])

    @property
    def model_kwargs(self) -> dict:
        """The model's keyword arguments of the last fit (as passed to :meth:`run`)."""
        result = self._require()
        return result.kwargs if result.batch is not None or self._given is None else dict(self._given[1])

    def site_gaussian(self, name: str):
        """``(mean, cov)`` of one site's basis coordinates (``cov`` over the flattened site)."""
        site, g = self.layout.site(name), self.gaussian
        index = np.arange(site.offset, site.offset + site.size)
        block = g.curvature.block(index) if self.batch_size is None else jax.vmap(
            lambda c: c.block(index))(g.curvature)
        return g.mean[..., index].reshape(g.mean.shape[:-1] + site.basis_shape), block

    def _result_part(self, tree):
        return None if tree is None else self._require().unpad(tree)

    # what ArviZ's from_numpyro reads of an MCMC object
    sampler = property(lambda self: self)
    _args = property(lambda self: self.model_args)
    _kwargs = property(lambda self: self.model_kwargs)


def _batch_info(traced: TracedModels, args, kwargs, batch):
    """The model traced for a batch, or why it cannot be (a forgotten batch axis, a data value
    the model needs as a concrete number)."""
    try:
        return traced.info(args, kwargs, batch.axes)
    except Exception as error:
        if not needs_concrete(error):
            raise _batch_trace_error(error, args, kwargs, batch) from error
        raise ValueError("run_many traces every data argument (one program for all data sets), and this model "
                         "needs one as a concrete value (a plate size from the data, np.unique, int(n)): call "
                         "run() per data set, or pass such values as Python numbers shared by the batch "
                         "(batch_axes=).") from error


def _batch_trace_error(error, args, kwargs, batch) -> Exception:
    """``error`` from tracing the model on one data set of a batch, with the batch's layout named:
    the usual cause is a forgotten batch axis (one data set passed to ``run_many``)."""
    if isinstance(error, (ObservedDataError, NotImplementedError)):
        return error
    arrays, _ = split_inputs((tuple(args), dict(kwargs or {})))
    shapes = [tuple(np.shape(a)) for a, b in zip(arrays, batch.axes) if b]
    return type(error)(
        f"run_many traced the model on one data set (entry 0 of the leading axis of every batched array; "
        f"batched shapes {shapes}, so {batch.size} data sets) and it raised {type(error).__name__}: {error}. Every "
        "batched array needs a leading axis of one entry per data set: stack B data sets as (B, ...), call run() "
        "for a single data set, or mark shared arrays with batch_axes=.") if _rebuildable(error) else error


def _rebuildable(error) -> bool:
    try:
        type(error)("")
    except Exception:  # noqa: BLE001 - an exception type that needs other arguments keeps its own message
        return False
    return True

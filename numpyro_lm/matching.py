"""``LaplaceMatching``: the MCMC-like entry point.

.. code-block:: python

    lm = LaplaceMatching(model)
    lm.run(jax.random.PRNGKey(0), *args, **kwargs)
    lm.get_samples(); lm.print_summary(); lm.posterior["tau"]  # a Gamma

The pipeline (one jit-compiled function per model and argument shapes, reused by later
``run`` calls with the same shapes):

1. trace the model; each latent site gets its LM basis (:mod:`numpyro_lm.bases`) and
   matched family (:mod:`numpyro_lm.families`);
2. find the mode of ``log p(x(y), data) + log|det dx/dy|`` over the flat basis vector
   ``y`` (:mod:`numpyro_lm.laplace`);
3. the joint Gaussian ``N(y*, H^-1)`` with ``H`` the negative Hessian there;
4. per site, the matched family from the site's Gaussian marginal (Laplace Matching,
   Hobbhahn and Hennig 2021);
5. joint draws through a Gaussian copula (:mod:`numpyro_lm.copula`), mapped back through
   the model.

References: M. Hobbhahn and P. Hennig, "Laplace Matching for fast Approximate Inference
in Latent Gaussian Models", arXiv:2105.03109 (2021); M. Hobbhahn, "Laplace Matching and
the Laplace Bridge", thesis (2021).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from functools import partial
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax import lax
from numpyro import handlers
from numpyro.diagnostics import print_summary as _print_summary
from numpyro.distributions.transforms import AffineTransform, ComposeTransform, IndependentTransform
from numpyro.infer.initialization import init_to_uniform, init_to_value
from tqdm.auto import tqdm

from .bases import get_basis
from .copula import copula_draws, copula_log_density
from .diagnostics import KHAT_OK, PSIS, importance_resample, khat_verdict, psis
from .families import family_names, get_family
from .laplace import (
    FAST_COMPILE,
    Gaussian,
    OptimState,
    default_tol,
    evaluate,
    gaussian_from_eigh,
    initial_state,
    singular_floor,
    lbfgs_minimize,
    newton_minimize,
    usable_compiler_options,
)
from .inference_data import to_inference_data
from .marginals import is_elementwise, matched_params
from .nested import (
    BATCH,
    MAX_CCD_DIM,
    NestedDesign,
    NonFiniteStart,
    ccd_points,
    conditional_fit,
    explore,
    integrate,
    matched_normaliser,
    mean_shift,
    mixture_moments,
    point_params,
    quantile_sites,
    site_values,
)
from .nested import draw as nested_draw
from .random import host_generator, standard_normal
from .refine import REFINE_METHODS, Refinement, gaussian_from_cov, refine_gaussian
from .trace import (
    Layout,
    SiteChoice,
    _substituted,
    _transform,
    constrain,
    init_values,
    potential,
    support_bounds,
    trace_sites,
    unravel,
)

__all__ = ["LaplaceMatching", "NotPositiveDefiniteError", "FAST_COMPILE"]


class NotPositiveDefiniteError(ValueError):
    """The negative Hessian at the mode is not positive definite."""


class _Static:
    """Hashable wrapper for a non-array model argument (compared by value, else identity)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def _key(self):
        try:
            hash(self.value)
            return (type(self.value), self.value)
        except TypeError:
            return (type(self.value), id(self.value))

    def __hash__(self):
        return hash(self._key())

    def __eq__(self, other):
        return isinstance(other, _Static) and self._key() == other._key()


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _split_inputs(tree):
    """Array leaves travel into jit as arguments; everything else is static."""
    leaves, treedef = jax.tree.flatten(tree)
    dynamic = [leaf if _is_array(leaf) else None for leaf in leaves]
    static = tuple(None if _is_array(leaf) else _Static(leaf) for leaf in leaves)
    return dynamic, (treedef, static)


def _merge_inputs(dynamic, static_key):
    treedef, static = static_key
    leaves = [d if s is None else s.value for d, s in zip(dynamic, static)]
    return jax.tree.unflatten(treedef, leaves)


class _Compiled(NamedTuple):
    layout: Layout
    fit: Callable
    resume: Callable
    refresh: Callable
    finish: Callable
    draw: Callable
    weigh: Callable
    inputs: Callable  # dynamic -> (args, kwargs, init_params)
    extra: dict  # further jitted functions of the fit (see LaplaceMatching._jitted)


class _Fit(NamedTuple):
    """Everything ``run`` computes (device arrays)."""

    state: OptimState
    sample_key: jnp.ndarray
    gaussian: Gaussian
    params: dict
    samples: dict
    flat: jnp.ndarray  # the draws in basis coordinates, (num_samples, D)
    finite: "_Finite"
    refinement: Optional[Refinement]


class _Finite(NamedTuple):
    """Finiteness checks computed inside the compiled function (one transfer, no dispatch)."""

    value: jnp.ndarray
    cov: jnp.ndarray
    params: dict

    @classmethod
    def of(cls, value, gaussian, params) -> "_Finite":
        """Whether ``value``, the Gaussian's covariance and each site's params are finite."""
        return cls(
            value=jnp.isfinite(value),
            cov=jnp.all(jnp.isfinite(gaussian.cov)),
            params={k: jnp.all(jnp.array([jnp.all(jnp.isfinite(v)) for v in p.values()])) for k, p in params.items()},
        )


class MatchedPosterior(Mapping):
    """``{site: numpyro Distribution}``: each site's matched family on its own domain."""

    def __init__(self, build: Callable, names: tuple, dependent: Callable):
        self._build, self._names, self._dependent = build, names, dependent
        self._cache = {}

    def __getitem__(self, name):
        if name not in self._names:
            raise KeyError(f"{name!r} is not a latent site; latent sites are {list(self._names)}")
        if name not in self._cache:
            if self._dependent(name):
                raise ValueError(
                    f"site {name!r} has a support that depends on other latent sites, so its "
                    "marginal has no closed-form matched family. Use lm.get_samples(), whose "
                    "draws map the site with the drawn values of the sites it depends on."
                )
            self._cache[name] = self._build(name)
        return self._cache[name]

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)

    def __repr__(self):
        return f"MatchedPosterior({list(self._names)})"


class AffineTransformed(dist.TransformedDistribution):
    """``loc + scale * X`` for a matched family ``X`` (bounded sites), with its moments."""

    @property
    def _affine(self):
        (t,) = self.transforms
        return t

    @property
    def mean(self):
        return self._affine.loc + self._affine.scale * self.base_dist.mean

    @property
    def variance(self):
        return jnp.square(self._affine.scale) * self.base_dist.variance


def _outer_transform(t):
    """The part of a basis transform after its core (``exp``/``sigmoid``): the bounds."""
    if isinstance(t, IndependentTransform):
        t = t.base_transform
    if isinstance(t, ComposeTransform) and len(t.parts) > 1:
        rest = t.parts[1:]
        return rest[0] if len(rest) == 1 else ComposeTransform(rest)
    return None


class LaplaceMatching:
    r"""Laplace Matching posterior of a NumPyro model, used like :class:`numpyro.infer.MCMC`.

    Each latent site is moved to its Laplace Matching basis (log for positive, logit for
    intervals, softmax over zero-sum logits for the simplex, matrix log for positive
    definite, identity for real; numpyro's ``biject_to`` otherwise). The joint mode of

    .. math:: \log p(x(y), \text{data}) + \log|\det \partial x / \partial y|

    over all basis coordinates ``y`` and the negative Hessian ``H`` there give the
    Gaussian :math:`N(y^*, H^{-1})`. Each site's Gaussian marginal is mapped in closed
    form to its matched family (Normal, Gamma, Beta, Dirichlet; the transformed Gaussian
    where there is none). On conjugate models (Gamma-Poisson, Beta-Binomial,
    Dirichlet-Multinomial, Normal-Normal) the matched family is the exact posterior.

    :param model: a NumPyro model (Python callable).
    :param int num_samples: draws made by :meth:`run` and returned by :meth:`get_samples`.
    :param dict bases: per-site basis override, e.g. ``{"sigma": "sqrt"}``
        (:func:`numpyro_lm.basis_names` lists them).
    :param dict families: per-site matched family override, e.g. ``{"tau": "gaussian"}``
        for the transformed Gaussian (:func:`numpyro_lm.family_names` lists them).
    :param init_strategy: a numpyro init strategy for the mode search. The default,
        ``None``, starts at the origin of the LM basis (every real site at 0, positive
        sites at 1, intervals at their centre, simplices uniform, matrices at the
        identity), which needs no compiled prior sampler; where the log density is not
        finite there it falls back to :func:`~numpyro.infer.initialization.init_to_uniform`.
    :param str method: ``"newton"`` (dense Hessian each step), ``"lbfgs"`` (optax L-BFGS,
        then Newton polishing) or ``"auto"`` (Newton up to ``newton_max_dim`` coordinates).
    :param float tol: convergence tolerance on the Newton decrement
        :math:`\sqrt{g^\top H^{-1} g}`, i.e. the distance to the mode in posterior
        standard deviations (default 1e-9 in float64, 1e-3 in float32).
    :param int max_iter: iteration budget of the mode search.
    :param float regularize: opt-in ridge added to the negative Hessian,
        :math:`H + r I`, when it is not positive definite. It changes the posterior:
        prefer float64 (``jax.config.update("jax_enable_x64", True)``) or a proper prior.
    :param bool progress_bar: show a progress bar when the mode search runs longer than
        two seconds.
    :param int newton_max_dim: largest dimension for which ``method="auto"`` picks Newton.
    :param str refine: improve the Laplace Gaussian (in the LM basis, before the matched
        families are computed) by Mixed Variational Inference (:mod:`numpyro_lm.refine`):
        ``"mean"`` (MVI_mu: the mean moves, the Laplace covariance stays), ``"eig"``
        (MVI_eig: the mean and the scales along the Laplace eigenvectors), ``"lowrank"``
        (MVI_lr: the mean and a rank-one update of the Cholesky root), ``"diag"`` (the
        factorised VI_diag baseline). ``None`` (default): plain Laplace. The bound before
        and after is in :meth:`diagnostics`. Needs the dense Laplace covariance (as every
        fit does today; a low-rank curvature would make ``"eig"`` act on its leading
        eigenvectors only).
    :param hyper: nested Laplace over hyperparameters (:mod:`numpyro_lm.nested`, INLA
        style): a list of latent sites (e.g. ``["tau"]``, at most ten coordinates) whose
        marginal posterior is integrated numerically (a lattice up to three coordinates,
        a central composite design beyond), with a Laplace approximation of the other
        sites conditional on each design point; no joint fit is made. Or ``"auto"``: the
        scalar or 2-vector sites outside every plate of a model that has plated latent
        sites (refused when they add up to more than three coordinates). For
        hierarchical models where the joint Laplace approximation misplaces a group
        scale. ``None`` (default): one joint Laplace approximation.
    :param int refine_num_samples: ``S``, the fixed standard normal draws of the bound.
    :param int refine_max_iter: L-BFGS iterations of the refinement.
    :param dict compiler_options: XLA options for the compiled fit (``jax.jit``'s
        ``compiler_options``). The default, ``FAST_COMPILE``, turns off LLVM's backend
        optimisations and uses XLA:CPU's elemental emitters: the first call compiles two
        to four times faster, and the small dense linear algebra of a Laplace fit runs
        about as fast. A nested fit (``hyper=``) runs its inner fits up to three times
        slower so compiled: pass ``None`` (XLA's defaults) for models whose log density
        is expensive to evaluate, or to refit the same model many times.
    """

    def __init__(
        self,
        model: Callable,
        *,
        num_samples: int = 1000,
        bases: Optional[dict] = None,
        families: Optional[dict] = None,
        init_strategy: Optional[Callable] = None,
        method: str = "auto",
        tol: Optional[float] = None,
        max_iter: int = 200,
        regularize: Optional[float] = None,
        newton_max_dim: int = 1000,
        progress_bar: bool = True,
        refine: Optional[str] = None,
        hyper=None,
        refine_num_samples: int = 1000,
        refine_max_iter: int = 200,
        compiler_options: Optional[dict] = FAST_COMPILE,
    ):
        if method not in ("auto", "newton", "lbfgs"):
            raise ValueError(f"method must be 'auto', 'newton' or 'lbfgs', not {method!r}")
        if num_samples < 1:
            raise ValueError(f"num_samples must be positive, not {num_samples}")
        if refine is not None and refine not in REFINE_METHODS:
            raise ValueError(f"refine must be None or one of {REFINE_METHODS}, not {refine!r}")
        if refine_num_samples < 1 or refine_max_iter < 0:
            raise ValueError("refine_num_samples must be positive and refine_max_iter non-negative")
        self.refine = refine
        if hyper is not None and hyper != "auto" and not (
            isinstance(hyper, (list, tuple)) and all(isinstance(h, str) for h in hyper) and hyper
        ):
            raise ValueError(f'hyper must be None, "auto" or a list of site names, not {hyper!r}')
        if hyper is not None and refine is not None:
            raise ValueError("refine= and hyper= cannot be combined yet; choose one")
        self.hyper = hyper
        self._design = None
        self.refine_num_samples = refine_num_samples
        self.refine_max_iter = refine_max_iter
        self.model = model
        self.num_samples = num_samples
        self.num_chains = 1
        self.thinning = 1
        self.method = method
        self.tol = tol
        self.max_iter = max_iter
        self.regularize = regularize
        self.newton_max_dim = newton_max_dim
        self.progress_bar = progress_bar
        self.compiler_options = compiler_options
        self.init_strategy = init_strategy
        self._choice = SiteChoice(dict(bases or {}), dict(families or {}))
        # unknown names fail here, not deep inside a trace
        for name in self._choice.bases.values():
            get_basis(name)
        for name in self._choice.families.values():
            if name not in family_names():
                get_family(name)  # raises with the list of families
        self._compiled = {}
        self._compiled_fit: Optional[_Compiled] = None
        self._fit: Optional[_Fit] = None
        self._posterior, self._dependent_sites, self._mode_sites = None, None, None
        self._draws, self._psis = {}, {}
        self._args, self._kwargs = (), {}

    # ------------------------------------------------------------------ compilation

    def _strategy(self, init_params):
        if init_params is not None:
            return init_to_value(values=init_params)
        return init_to_uniform if self.init_strategy is None else self.init_strategy

    def _method_for(self, layout: Layout) -> str:
        if self.method != "auto":
            return self.method
        return "newton" if layout.size <= self.newton_max_dim else "lbfgs"

    def _compile(self, rng_key, static_key, dynamic) -> _Compiled:
        model, choice = self.model, self._choice
        args, kwargs, init_params = _merge_inputs(dynamic, static_key)
        layout = trace_sites(model, args, kwargs, choice, self._strategy(init_params), rng_key)
        method = self._method_for(layout)
        dtype = jnp.result_type(float)
        tol = default_tol(dtype) if self.tol is None else self.tol
        max_iter, regularize = self.max_iter, self.regularize

        def inputs(dynamic):
            return _merge_inputs(dynamic, static_key)

        def neg_log_density(args, kwargs, flat):
            return -potential(model, layout, choice, flat, args, kwargs)

        def advance(state, until, args, kwargs):
            fn = partial(neg_log_density, args, kwargs)
            if method == "lbfgs":
                # L-BFGS to a loose gradient tolerance, then Newton certifies the mode.
                state = lbfgs_minimize(fn, state, gtol=jnp.sqrt(tol), max_iter=until)
                return newton_minimize(fn, state, tol, until + 10)
            return newton_minimize(fn, state, tol, until)

        def start(rng_key, dynamic, until, at_origin):
            args, kwargs, init_params = inputs(dynamic)
            if at_origin:  # no model trace and no PRNG program to compile
                x0 = jnp.zeros(layout.size, dtype)
            else:
                strategy = self._strategy(init_params)
                x0 = init_values(model, layout, choice, strategy, rng_key, args, kwargs)
            return advance(initial_state(x0), until, args, kwargs)

        def resume(state, dynamic, until):
            args, kwargs, _ = inputs(dynamic)
            return advance(state, until, args, kwargs)

        def refresh(state, dynamic):
            args, kwargs, _ = inputs(dynamic)
            return evaluate(partial(neg_log_density, args, kwargs), state)

        def draw(rng_key, gaussian, params, dynamic, num_samples):
            args, kwargs, _ = inputs(dynamic)
            flat = copula_draws(rng_key, gaussian, layout, params, num_samples)
            return jax.vmap(lambda y: constrain(model, layout, choice, y, args, kwargs))(flat), flat

        def weigh(rng_key, gaussian, params, flat, dynamic):
            # log p and log q of the draws, both over the basis coordinates; the copula's
            # Gaussian draw is regenerated from the same key and stream (not stored)
            args, kwargs, _ = inputs(dynamic)
            num_samples = flat.shape[0]
            z = gaussian.sample(rng_key, num_samples, stream=num_samples)
            log_q = copula_log_density(flat, z, gaussian, layout, params)
            log_p = jax.vmap(lambda y: potential(model, layout, choice, y, args, kwargs))(flat)
            return log_p, log_q

        refine, refine_samples, refine_iter = self.refine, self.refine_num_samples, self.refine_max_iter

        def refined(gaussian, rng_key, dynamic):
            if refine is None:
                return gaussian, None
            args, kwargs, _ = inputs(dynamic)
            d = layout.size
            # fixed draws, streams apart from the copula's (which use num_samples)
            z = standard_normal(rng_key, (refine_samples, d), dtype, stream=2**31 - 1)
            noise = standard_normal(rng_key, (2 * d,), dtype, stream=2**31 - 2)
            return refine_gaussian(
                lambda y: potential(model, layout, choice, y, args, kwargs),
                gaussian, refine, z, noise, refine_iter, gtol=jnp.sqrt(tol),
            )

        def finish(state, rng_key, dynamic, num_samples):
            ridge = 0.0 if regularize is None else regularize
            precision = state.hess + ridge * jnp.eye(layout.size, dtype=state.hess.dtype)
            gaussian = gaussian_from_eigh(state.x, precision, state.eigenvalues + ridge, state.eigenvectors)
            gaussian, refinement = refined(gaussian, rng_key, dynamic)
            params = matched_params(layout, gaussian.mean, gaussian.cov)
            samples, flat = draw(rng_key, gaussian, params, dynamic, num_samples)
            return _Fit(
                state=state,
                sample_key=rng_key,
                gaussian=gaussian,
                params=params,
                samples=samples,
                flat=flat,
                finite=_Finite.of(state.value, gaussian, params),
                refinement=refinement,
            )

        def start_and_finish(rng_key, dynamic, until, num_samples, at_origin):
            # one compiled program for the common case (converged within ``until``); the
            # init strategy's PRNG streams and the copula's host draws do not overlap, so
            # one key serves both
            return finish(start(rng_key, dynamic, until, at_origin), rng_key, dynamic, num_samples)

        jit = partial(jax.jit, compiler_options=self._xla_options)
        return _Compiled(
            layout=layout,
            fit=jit(start_and_finish, static_argnums=(3, 4)),
            resume=jit(resume),
            refresh=jit(refresh),
            finish=jit(finish, static_argnums=(3,)),
            draw=jit(draw, static_argnums=(4,)),
            weigh=jit(weigh),
            inputs=inputs,
            extra={},
        )

    def _prepare(self, rng_key, args, kwargs, init_params):
        dynamic, static_key = _split_inputs((args, kwargs, init_params))
        shapes = tuple(None if d is None else (jnp.shape(d), jnp.result_type(d)) for d in dynamic)
        key = (static_key, shapes, jax.config.jax_enable_x64)
        if key not in self._compiled:
            self._compiled[key] = self._compile(rng_key, static_key, dynamic)
        return self._compiled[key], dynamic

    # ------------------------------------------------------------------------ run

    def run(self, rng_key, *args, init_params: Optional[dict] = None, **kwargs):
        """Find the mode, the curvature and the matched posterior; draw ``num_samples``.

        :param rng_key: PRNG key (init strategy and draws).
        :param args, kwargs: the model's arguments. Arrays are traced (a second call with
            the same shapes reuses the compiled code); other values are static.
        :param dict init_params: optional initial *constrained* values per site.
        """
        compiled, dynamic = self._prepare(rng_key, args, kwargs, init_params)
        self._args, self._kwargs = args, kwargs
        self._layout, self._compiled_fit, self._dynamic = compiled.layout, compiled, dynamic
        self._posterior, self._dependent_sites, self._mode_sites = None, None, None
        self._draws, self._psis = {}, {}

        # Iterations per compiled call: the progress bar can only move between calls.
        chunk = min(self.max_iter, 25 if compiled.layout.size <= 500 else 5)
        at_origin = self.init_strategy is None and init_params is None
        self._design, self._nested_log_q = None, {}
        if self.hyper is not None:
            self._fit = self._nested(compiled, rng_key, dynamic, at_origin)
            self._check(self._fit)
            return self
        n = self.num_samples
        fit = compiled.fit(rng_key, dynamic, chunk, n, at_origin)
        if at_origin and not bool(fit.finite.value):
            # the basis origin lies outside the density's support (e.g. the sqrt basis)
            fit = compiled.fit(rng_key, dynamic, chunk, n, False)
        state = fit.state
        if not bool(state.fresh) or self._needs_more(state):
            state = self._resume(compiled, state, dynamic, chunk)
            if not bool(state.fresh):
                state = compiled.refresh(state, dynamic)
            fit = compiled.finish(state, fit.sample_key, dynamic, n)
        self._fit = fit
        self._check(fit)
        return self

    def _needs_more(self, state) -> bool:
        return not (bool(state.converged) or bool(state.stalled)) and int(state.num_iter) < self.max_iter

    def _resume(self, compiled, state, dynamic, chunk):
        with tqdm(
            total=self.max_iter,
            initial=int(state.num_iter),
            desc="LaplaceMatching mode search",
            disable=not self.progress_bar,
            delay=2.0,
        ) as bar:
            while self._needs_more(state):
                done = int(state.num_iter)
                state = compiled.resume(state, dynamic, min(done + chunk, self.max_iter))
                bar.update(int(state.num_iter) - done)
                bar.set_postfix(step_sd=f"{float(state.decrement):.2e}")
        return state

    def _check(self, fit: _Fit):
        finite = jax.device_get(fit.finite)
        if not finite.value:
            raise ValueError(
                "the log density is not finite at the initial point or the mode. Check the "
                "model's supports and data, or pass init_params= / init_strategy=."
            )
        if not finite.cov:
            raise self._not_positive_definite(np.asarray(fit.gaussian.precision))
        if not bool(fit.state.converged):
            warnings.warn(
                f"the mode search did not converge after {int(fit.state.num_iter)} iterations "
                f"(last Newton step {float(fit.state.decrement):.2e} posterior SDs, max |gradient| "
                f"{float(fit.state.grad_norm):.2e}). Increase max_iter, use float64, or check the "
                "model for an unbounded density.",
                stacklevel=3,
            )
        for site in self._layout.sites:
            if not finite.params[site.name]:
                raise ValueError(
                    f"site {site.name!r}: the matched {site.family!r} parameters are not finite. "
                    f"Choose families={{{site.name!r}: 'gaussian'}} for this site or use float64."
                )

    def _not_positive_definite(self, precision) -> NotPositiveDefiniteError:
        eigval, eigvec = np.linalg.eigh(precision)
        floor = float(singular_floor(jnp.asarray(eigval)))
        bad = np.flatnonzero(eigval <= floor) if np.any(eigval <= floor) else np.array([0])
        weights = np.sum(eigvec[:, bad] ** 2, axis=1)
        top = np.argsort(-weights)[:5]
        where = ", ".join(f"{self._layout.coordinate(int(i))} ({weights[i]:.2f})" for i in top if weights[i] > 1e-3)
        x64 = jax.config.jax_enable_x64
        hint = (
            "the model's density may be improper or unidentified along these directions: "
            "give them a proper prior"
            if x64
            else 'float32 Hessians of models with many observations are often not positive '
            'definite: enable float64 with jax.config.update("jax_enable_x64", True)'
        )
        if eigval[0] > 0:
            what = (f"numerically singular (eigenvalues from {eigval[0]:.3g} to {eigval[-1]:.3g}: a "
                    f"condition number beyond what {np.finfo(eigval.dtype).dtype} resolves)")
        else:
            what = f"not positive definite (smallest eigenvalue {eigval[0]:.3g})"
        return NotPositiveDefiniteError(
            f"the negative Hessian at the mode is {what}; the flat directions involve {where}. "
            f"Likely cause: {hint}. "
            "As a last resort pass regularize=<ridge> to LaplaceMatching (this changes the "
            "posterior)."
        )

    # ------------------------------------------------------------------ results

    def _require_fit(self):
        if self._fit is None:
            raise RuntimeError("call run() first")
        return self._fit

    # --------------------------------------------------------- nested Laplace

    def _hyper_sites(self) -> list:
        layout, names = self._layout, [s.name for s in self._layout.sites]
        if self.hyper != "auto":
            unknown = [h for h in self.hyper if h not in names]
            if unknown:
                raise ValueError(f"hyper names {unknown}, which are not latent sites; the latent sites are {names}")
            return list(self.hyper)
        chosen = [s.name for s in layout.sites if not s.plates and s.size <= 2]
        plated = any(s.plates for s in layout.sites)
        size = sum(layout.site(n).size for n in chosen)
        if not plated or not chosen or size > 3:
            raise ValueError(
                'hyper="auto" looks for at most three coordinates of global sites above plated '
                f"latent sites and found {chosen} ({size} coordinates) in a model "
                f"{'with' if plated else 'without'} plated latent sites. Name them: hyper=[...]."
            )
        return chosen

    def _constrained(self, flat):
        model, layout, choice = self.model, self._layout, self._choice

        def fn(flat, args, kwargs):
            return jax.vmap(lambda y: constrain(model, layout, choice, y, args, kwargs))(flat)

        return self._jitted("constrain", fn)(flat)

    def _nested(self, compiled: _Compiled, rng_key, dynamic, at_origin: bool) -> _Fit:
        """The nested Laplace fit (:mod:`numpyro_lm.nested`); no joint fit is made."""
        layout, model, choice = self._layout, self.model, self._choice
        hyper = set(self._hyper_sites())
        coords = {s.name: np.arange(s.offset, s.offset + s.size) for s in layout.sites}
        theta_index = np.concatenate([coords[s.name] for s in layout.sites if s.name in hyper])
        x_index = np.concatenate([coords[s.name] for s in layout.sites if s.name not in hyper] or [np.zeros(0, int)])
        if x_index.size == 0:
            raise ValueError("hyper= names every latent site: nothing is left for the conditional Laplace step")
        if theta_index.size > MAX_CCD_DIM:
            ccd_points(theta_index.size)  # refuses, naming the limit
        dtype, size, max_iter = jnp.result_type(float), layout.size, self.max_iter
        tol = default_tol(dtype) if self.tol is None else self.tol

        # coordinates drawn through each point's matched family (quantile sites); the others
        # come from their conditional Gaussians and get a conditional mean (mean_shift)
        mapped = np.zeros(size, bool)
        for site, _ in quantile_sites(layout, theta_index):
            mapped[site.offset : site.offset + site.size] = True
        gaussian_cols = ~mapped[x_index]

        def inner(thetas, x0s, with_shift, args, kwargs):
            def neg(theta, x):
                return -potential(model, layout, choice, site_values(layout, theta_index, theta, x), args, kwargs)

            fits = jax.vmap(lambda t, x0: conditional_fit(neg, t, x0, tol, max_iter))(thetas, x0s)
            shift = jnp.zeros_like(fits.x)
            if np.any(gaussian_cols):  # only the design's points need it (not the mode search's)
                shift = lax.cond(
                    with_shift,
                    lambda: jnp.where(gaussian_cols, jax.vmap(partial(mean_shift, neg))(thetas, fits.x, fits.cov), 0.0),
                    lambda: shift,
                )
            params = point_params(layout, theta_index, fits.x, fits.cov)
            log_density = fits.log_density + matched_normaliser(
                layout, theta_index, fits.x, fits.precision_diagonal, fits.uncoupled, params
            )
            return fits._replace(log_density=log_density, params=params, shift=shift)

        inner = self._jitted("nested_marginal", inner)
        bar = tqdm(desc="nested Laplace inner fits", unit="fit", disable=not self.progress_bar, delay=2.0)

        def batched(fn, *arrays, batch=BATCH):
            # fixed-size batches: one compilation serves the stencil, the line search and the
            # design; padding and gathering on the host (eager JAX slicing costs more than the fit)
            n, pad = len(arrays[0]), -len(arrays[0]) % batch
            arrays = [np.asarray(a, dtype) for a in arrays]
            arrays = [np.concatenate([a, np.broadcast_to(a[:1], (pad,) + a.shape[1:])]) for a in arrays]
            parts = jax.device_get([fn(*(a[i : i + batch] for a in arrays)) for i in range(0, n + pad, batch)])
            return jax.tree.map(lambda *a: np.concatenate(a)[:n], *parts)

        def marginal(thetas, x0s, with_shift=False):
            bar.update(len(thetas))
            flag = np.asarray(with_shift)
            return batched(lambda t, x: inner(t, x, flag), thetas, x0s)

        with bar:
            start = np.zeros(size) if at_origin else self._start_point(rng_key)
            try:
                search = explore(marginal, start[theta_index], start[x_index])
            except NonFiniteStart:
                if not at_origin:
                    raise
                # the basis origin lies outside the density's support (e.g. the sqrt basis)
                start = self._start_point(rng_key)
                search = explore(marginal, start[theta_index], start[x_index])
            design = integrate(marginal, search, theta_index, x_index, gaussian_cols)
        if design.edge_mass > 1e-3:
            warnings.warn(
                f"nested Laplace: {design.edge_mass:.1%} of the hyperparameters' mass lies on the edge "
                "of the integration design; the marginal reaches beyond the lattice's extent or inner "
                "fits failed there, and the tail beyond it is missing.",
                stacklevel=3,
            )
        self._design = design
        samples, flat = self._nested_draws(rng_key, self.num_samples)
        # the mixture's mean and covariance in the basis: the Gaussian-mixture moments for
        # sites drawn from their conditional Gaussians, the draws' moments where the draws
        # went through each design point's matched family
        mean_all, cov_all = mixture_moments(design, size)
        draws = np.asarray(flat, np.float64)
        mean_all[mapped] = draws[:, mapped].mean(0)
        cov_draws = np.cov(draws.T).reshape(size, size)
        cov_all[mapped, :] = cov_draws[mapped, :]
        cov_all[:, mapped] = cov_draws[:, mapped]

        def match(mean, cov, args, kwargs):
            gaussian = gaussian_from_cov(mean, cov)
            params = matched_params(layout, gaussian.mean, gaussian.cov)
            return gaussian, params, _Finite.of(0.0, gaussian, params)  # the mode search ran on the host

        # host arrays throughout: an eager jnp conversion compiles a program of its own
        gaussian, params, finite = self._jitted("nested_match", match)(
            np.asarray(mean_all, dtype), np.asarray(cov_all, dtype)
        )
        mode = np.zeros(size, dtype)
        mode[theta_index], mode[x_index] = search.theta, search.x
        # the mode search reported is the hyperparameters' (outer) one
        square, true = np.zeros((size, size), dtype), np.asarray(True)
        state = OptimState(
            x=mode, value=np.asarray(-search.log_density, dtype), grad=np.zeros(size, dtype), hess=square,
            eigenvalues=np.zeros(size, dtype), eigenvectors=square,
            grad_norm=np.asarray(search.grad_norm, dtype), decrement=np.asarray(search.decrement, dtype),
            num_iter=np.asarray(search.num_iter), converged=true, stalled=np.asarray(False), fresh=true,
        )
        return _Fit(state=state, sample_key=rng_key, gaussian=gaussian, params=params, samples=samples, flat=flat,
                    finite=finite, refinement=None)

    def _start_point(self, rng_key) -> np.ndarray:
        """Basis coordinates of the init strategy's point (``init_params`` if given)."""
        compiled = self._compiled_fit
        if "start" not in compiled.extra:
            model, layout, choice = self.model, self._layout, self._choice

            def start(rng_key, dynamic):
                args, kwargs, init_params = compiled.inputs(dynamic)
                return init_values(model, layout, choice, self._strategy(init_params), rng_key, args, kwargs)

            compiled.extra["start"] = jax.jit(start, compiler_options=self._xla_options)
        return np.asarray(compiled.extra["start"](rng_key, self._dynamic), np.float64)

    def _nested_draws(self, key, num_samples: int):
        flat, log_q = nested_draw(host_generator(key, stream=num_samples), self._design, self._layout, num_samples)
        self._nested_log_q[num_samples] = log_q
        flat = jax.device_put(np.asarray(flat, jnp.result_type(float)))  # no eager program to compile
        return self._constrained(flat), flat

    @property
    def design(self) -> Optional[NestedDesign]:
        """The nested Laplace design (points, weights, conditionals), or ``None``."""
        self._require_fit()
        return self._design

    # ------------------------------------------------------------------ draws

    def _draws_of(self, num_samples: Optional[int]):
        """``(samples, flat)``: the ``run`` draws, or ``num_samples`` new ones (kept)."""
        fit = self._require_fit()
        if num_samples is None or num_samples == self.num_samples:
            return fit.samples, fit.flat
        if num_samples < 1:
            raise ValueError(f"num_samples must be positive, not {num_samples}")
        if num_samples not in self._draws and self._design is not None:
            self._draws[num_samples] = self._nested_draws(fit.sample_key, num_samples)
        if num_samples not in self._draws:
            # the copula's host streams are keyed by num_samples: new, independent draws
            self._draws[num_samples] = self._compiled_fit.draw(
                fit.sample_key, fit.gaussian, fit.params, self._dynamic, num_samples
            )
        return self._draws[num_samples]

    def _weights(self, num_samples: Optional[int] = None):
        """``(log_p, log_q, PSIS)`` of the draws (computed once per set of draws)."""
        n = self.num_samples if num_samples is None else num_samples
        if n not in self._psis:
            fit = self._require_fit()
            _, flat = self._draws_of(n)
            if self._design is not None:  # the mixture's own density (numpyro_lm.nested.draw)
                log_p = np.asarray(self._log_densities(flat))
                log_q = self._nested_log_q[n]().astype(log_p.dtype)
            else:
                log_p, log_q = jax.device_get(
                    self._compiled_fit.weigh(fit.sample_key, fit.gaussian, fit.params, flat, self._dynamic)
                )
            # spread of log p - log q that rounding alone produces (exact approximations)
            noise = np.sqrt(np.finfo(log_p.dtype).eps) * (1.0 + np.max(np.abs(log_p)))
            self._psis[n] = (log_p, log_q, psis(log_p, log_q, noise=noise))
        return self._psis[n]

    def _log_densities(self, flat):
        model, layout, choice = self.model, self._layout, self._choice

        def fn(flat, args, kwargs):
            return jax.vmap(lambda y: potential(model, layout, choice, y, args, kwargs))(flat)

        return self._jitted("log_density", fn)(flat)

    def get_samples(
        self,
        num_samples: Optional[int] = None,
        group_by_chain: bool = False,
        resample: Optional[str] = None,
        rng_key=None,
    ):
        r"""Constrained joint draws ``{site: array}``, as :meth:`numpyro.infer.MCMC.get_samples`.

        Latent and deterministic sites; each latent coordinate follows its matched family
        and coordinates keep the Laplace correlations (Gaussian copula, see
        :mod:`numpyro_lm.copula`).

        :param int num_samples: draw this many new samples instead of the ``run`` draws.
        :param bool group_by_chain: add a leading chain axis of size 1.
        :param str resample: ``"psis"`` for Pareto smoothed importance resampling
            (:mod:`numpyro_lm.diagnostics`): the draws are resampled with weights
            :math:`p/q` so that they follow the model's posterior more closely than the
            approximation does. Refused when the Pareto :math:`\hat k` exceeds 0.7 (the
            weights cannot be trusted). Resampled draws repeat; their effective number is
            ``diagnostics()["psis_ess"]``.
        :param rng_key: PRNG key of the resampling (default: derived from ``run``'s key).
        """
        samples, _ = self._draws_of(num_samples)
        if resample is not None:
            samples = self._resample(samples, num_samples, resample, rng_key)
        if group_by_chain:
            samples = jax.tree.map(lambda x: x[None], samples)
        return samples

    def _resample(self, samples, num_samples, method, rng_key):
        if method != "psis":
            raise ValueError(f'resample must be None or "psis", not {method!r}')
        weights = self._weights(num_samples)[2]
        if not weights.khat <= KHAT_OK:
            raise ValueError(
                "PSIS resampling refused: " + khat_verdict(weights.khat) + " Importance "
                "weights this heavy-tailed give estimates dominated by a few draws."
            )
        key = self._fit.sample_key if rng_key is None else rng_key
        index = importance_resample(host_generator(key, stream=1), weights.log_weights, len(weights.log_weights))
        return jax.tree.map(lambda x: x[index], samples)

    def get_extra_fields(self, group_by_chain: bool = False) -> dict:
        """Per-draw statistics, as :meth:`numpyro.infer.MCMC.get_extra_fields`.

        ``lp``: the model's unnormalised log density of the draw in LM-basis coordinates
        (log joint plus the basis log-Jacobian); ``log_q``: the approximation's log density
        in the same coordinates; ``log_weight``: ``lp - log_q``, the raw importance
        log-weight (constant when the approximation is exact).
        """
        log_p, log_q, _ = self._weights()
        fields = {"lp": log_p, "log_q": log_q, "log_weight": log_p - log_q}
        if group_by_chain:
            fields = {k: v[None] for k, v in fields.items()}
        return fields

    @property
    def _xla_options(self) -> Optional[dict]:
        """``compiler_options`` as this jaxlib takes them (see ``usable_compiler_options``)."""
        return usable_compiler_options(self.compiler_options)

    def _jitted(self, name: str, fn: Callable) -> Callable:
        """``fn(*arrays, args, kwargs)`` jit-compiled once per model and argument shapes.

        For work on a fitted model outside ``run`` (e.g. the NUTS warm start); returns a
        function of the arrays alone, bound to the arguments of the last ``run``.
        """
        compiled = self._compiled_fit
        if compiled is None:
            raise RuntimeError("call run() first")
        if name not in compiled.extra:
            inputs = compiled.inputs

            def call(dynamic, *arrays):
                args, kwargs, _ = inputs(dynamic)
                return fn(*arrays, args, kwargs)

            compiled.extra[name] = jax.jit(call, compiler_options=self._xla_options)
        return partial(compiled.extra[name], self._dynamic)

    def to_inference_data(
        self,
        *,
        rng_key=None,
        posterior_predictive=False,
        prior=False,
        num_prior_samples: Optional[int] = None,
        log_likelihood: bool = True,
        constant_data: Optional[dict] = None,
        coords: Optional[dict] = None,
        dims: Optional[dict] = None,
    ):
        """ArviZ ``InferenceData`` of the fit: posterior, sample_stats, log_likelihood,
        observed and constant data, and on request posterior predictive and prior draws.

        Arguments as :func:`numpyro_lm.inference_data.to_inference_data`;
        ``az.from_numpyro(lm)`` gives the same posterior, sample_stats and log_likelihood.
        """
        self._require_fit()
        return to_inference_data(
            self, rng_key=rng_key, posterior_predictive=posterior_predictive, prior=prior,
            num_prior_samples=num_prior_samples, log_likelihood=log_likelihood,
            constant_data=constant_data, coords=coords, dims=dims,
        )

    @property
    def sampler(self):
        """``self``: what ArviZ reads as ``mcmc.sampler`` (it needs ``.model``)."""
        return self

    @property
    def layout(self) -> Layout:
        """The latent sites, their bases, families and places in the flat vector."""
        self._require_fit()
        return self._layout

    @property
    def gaussian(self) -> Gaussian:
        """The joint Laplace Gaussian over the flat basis coordinates (see :attr:`layout`)."""
        return self._require_fit().gaussian

    def site_gaussian(self, name: str):
        """``(mean, cov)`` of one site's basis coordinates (``cov`` over the flattened site)."""
        site = self.layout.site(name)
        g = self.gaussian
        index = np.arange(site.offset, site.offset + site.size)
        return g.mean[index].reshape(site.basis_shape), g.cov[np.ix_(index, index)]

    @property
    def posterior(self) -> MatchedPosterior:
        """``{site: Distribution}``: each site's matched family with the site's shape."""
        fit = self._require_fit()
        if self._posterior is None:
            self._posterior = MatchedPosterior(
                self._site_distribution, tuple(s.name for s in self._layout.sites), self._is_dependent
            )
        return self._posterior

    def _mode_trace(self):
        """The model's trace at the mode (once per fit: every site's posterior reads it)."""
        if self._mode_sites is None:
            flat = self._fit.gaussian.mean
            model = _substituted(self.model, self._layout, self._choice, flat)
            self._mode_sites = handlers.trace(model).get_trace(*self._args, **self._kwargs)
        return self._mode_sites

    def _is_dependent(self, name: str) -> bool:
        if self._dependent_sites is None:
            bounds = partial(support_bounds, self.model, self._layout, self._choice)
            jac = jax.jacfwd(lambda y: bounds(y, self._args, self._kwargs))(self._fit.gaussian.mean)
            self._dependent_sites = {k for k, v in jac.items() if v.size and bool(jnp.any(v != 0))}
        return name in self._dependent_sites

    def _site_distribution(self, name: str):
        site = self._layout.site(name)
        family = get_family(site.family, site.basis)
        params = self._fit.params[name]
        d = family.distribution(params)
        if is_elementwise(site, family) and site.basis_event_dim > 0:
            d = d.to_event(site.basis_event_dim)
        transform = _transform(self._choice, self._mode_trace()[name])
        if family.in_basis:
            return dist.TransformedDistribution(d, transform)
        outer = _outer_transform(transform)
        if outer is None:
            return d
        if isinstance(outer, AffineTransform):
            return AffineTransformed(d, outer)
        return dist.TransformedDistribution(d, outer)

    def diagnostics(self) -> dict:
        """How far the fit can be trusted.

        The mode search (iterations, convergence, final Newton step in posterior SDs and
        gradient), the curvature (smallest and largest eigenvalue of the negative Hessian
        and their ratio), and the importance-sampling check of the ``run`` draws
        (:mod:`numpyro_lm.diagnostics`): ``pareto_k`` (below 0.5 good, up to 0.7 usable
        with ``resample="psis"``, above 0.7 the approximation misses the posterior),
        ``psis_ess``, ``elbo`` and ``log_evidence`` (up to the model's normaliser),
        and ``verdict``, the same in words.
        """
        fit = self._require_fit()
        eig = np.asarray(fit.gaussian.eigenvalues)
        weights = self._weights()[2]
        return {
            "num_iter": int(fit.state.num_iter),
            "converged": bool(fit.state.converged),
            "newton_decrement": float(fit.state.decrement),
            "grad_norm": float(fit.state.grad_norm),
            "log_density_at_mode": float(-fit.state.value),
            "dimension": int(self._layout.size),
            "hessian_min_eigenvalue": float(eig[0]),
            "hessian_max_eigenvalue": float(eig[-1]),
            "hessian_condition_number": float(eig[-1] / eig[0]) if eig[0] > 0 else float("inf"),
            "pareto_k": weights.khat,
            "psis_ess": weights.ess,
            "elbo": weights.elbo,
            "log_evidence": weights.log_evidence,
            "num_samples": int(self.num_samples),
            "verdict": khat_verdict(weights.khat),
            **self._refine_diagnostics(),
            **self._nested_diagnostics(),
        }

    def _nested_diagnostics(self) -> dict:
        d = self._design
        if d is None:
            return {"hyper": None}
        return {
            "hyper": self._hyper_sites(),
            "nested_design": d.kind,
            "nested_design_points": int(d.theta.shape[0]),
            "nested_edge_mass": d.edge_mass,
            "nested_outer_iter": d.num_outer_iter,
            "nested_inner_fits": d.num_evaluations,
        }

    def _refine_diagnostics(self) -> dict:
        r = self._fit.refinement
        if r is None:
            return {"refine": None}
        return {
            "refine": self.refine,
            "refine_elbo_before": float(r.elbo_before),
            "refine_elbo_after": float(r.elbo_after),
            "refine_num_iter": int(r.num_iter),
            "refine_grad_norm": float(r.grad_norm),
        }

    def print_summary(self, prob: float = 0.9, exclude_deterministic: bool = True):
        """Print mean, sd, median, quantiles, n_eff and r_hat per latent site, as MCMC does.

        The draws are independent, so n_eff should be close to ``num_samples`` and r_hat
        close to 1: they check the sampler, not the approximation. The diagnostics below
        the table describe the mode search, the curvature, and whether the approximation
        can be trusted (:meth:`diagnostics`).
        """
        samples = self.get_samples()
        if exclude_deterministic:
            samples = {s.name: samples[s.name] for s in self._layout.sites}
        _print_summary(samples, prob=prob, group_by_chain=False)
        d = self.diagnostics()
        print(
            f"Mode search: {d['num_iter']} iterations, "
            f"{'converged' if d['converged'] else 'NOT converged'} "
            f"(last step {d['newton_decrement']:.1e} posterior SDs, max |grad| {d['grad_norm']:.1e}).\n"
            f"Negative Hessian eigenvalues in [{d['hessian_min_eigenvalue']:.3g}, "
            f"{d['hessian_max_eigenvalue']:.3g}], condition number {d['hessian_condition_number']:.3g}.\n"
            "Matched families: "
            + ", ".join(f"{s.name} ~ {s.family} ({s.basis} basis)" for s in self._layout.sites)
            + f"\nDid it work? Pareto smoothed importance sampling of log p - log q over "
            f"{d['num_samples']} draws: {d['verdict']} (importance ESS {d['psis_ess']:.0f}.)"
        )

r"""Laplace-marginal NUTS: NUTS over the hyperparameters, Laplace over the latent field.

The latent coordinates of a model split into hyperparameters :math:`\phi` (global scales,
locations: few) and a latent field :math:`\theta` (sites inside plates, Gaussian-process
values: many), both in their Laplace Matching bases. NUTS samples :math:`\phi` from the
*Laplace marginal*

.. math:: \log \tilde p(\phi \mid y) = \log p(y, \theta^*(\phi), \phi)
          + \tfrac{d}{2}\log 2\pi - \tfrac12 \log\det H(\phi) + \text{const},

with :math:`\theta^*(\phi) = \arg\max_\theta \log p(y, \theta, \phi)` found by the package's
Newton method (:func:`numpyro_lm.laplace.laplace_update`) and :math:`H(\phi)` the negative
Hessian in :math:`\theta` there (Tierney and Kadane 1986; Rue, Martino and Chopin 2009). The
gradient in :math:`\phi` goes through :math:`\theta^*` by the implicit function theorem:
:math:`\nabla_\theta \log p = 0` at the mode, so
:math:`\partial\theta^*/\partial\phi = H^{-1}\,\partial^2_{\theta\phi}\log p`, applied as one
linear solve and one vector-Jacobian product (:func:`conditional_mode`, a ``custom_vjp``):
the Newton iterations are never differentiated. Margossian et al. (2020, "Hamiltonian Monte
Carlo using an adjoint-differentiated Laplace approximation") and blackjax's ``laplace_hmc``
do the same for a hand-written ``log_joint(theta, phi)``; here any NumPyro model works.

Where the field is one scalar per plate entry given :math:`\phi` (a random intercept per
group), each entry's integral is taken by adaptive Gauss-Hermite quadrature about its mode
(:func:`~numpyro_lm.nested.quadrature.block_quadrature_correction`, nine model gradients):
Laplace underestimates a binary group's spread and with it the variance component (Breslow
and Lin 1995; lme4's ``glmer(nAGQ=)``). The target :math:`\tilde p_L(\phi \mid y)\,e^{c(\phi)}`
(:math:`c` the correction) is NUTS's potential (``quadrature=True``, default), or reached by
*delayed acceptance* (``"delayed"``; Christen and Fox 2005): NUTS moves on :math:`\tilde p_L`,
a reversible :math:`\tilde p_L`-invariant kernel, and its move is kept with probability
:math:`\min(1, e^{c(\phi') - c(\phi)})`, which leaves the target invariant exactly. It takes
the nine gradients once per iteration, not per leapfrog step, but loses NUTS's anticorrelated
draws (a 1000-group GLMM: about half the ESS per second), hence not the default.

Each NUTS step starts its inner searches at the previous step's :math:`\theta^*`
(NumPyro's functional ``hmc`` regenerates the potential from arguments each step, which
carry it), so a search takes a few Newton steps where :math:`\phi` moved a little.

After each NUTS step, one draw of :math:`\theta` comes from the conditional Laplace
Gaussian :math:`N(\theta^*(\phi), H(\phi)^{-1})` in the basis, so the chain holds every
latent site, constrained, as NUTS's would.

An inner solve that does not converge, or stops where :math:`H` is not positive definite,
gives an infinite potential: NUTS counts the trajectory as divergent and does not move
there. The state records whether the solve at each kept draw converged
(``inner_failed``), so ``MCMC(..., extra_fields=("inner_failed",))`` counts them.
"""

from __future__ import annotations

import inspect
from functools import lru_cache, partial
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import init_to_median
from numpyro.infer.hmc import hmc
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import is_prng_key

from .curvature_choice import hessian_for
from .hessian import ArrowheadHessian, DenseHessian, plate_structure, structure_tol
from .laplace import laplace_init, laplace_update
from .model import model_info
from .nested.inner import scalar_blocks
from .nested.quadrature import GH_NODES, block_quadrature_correction
from .optimize import default_tol
from .static_data import static_where_needed
from .trace import Layout, site_values

__all__ = ["LaplaceNUTS", "LaplaceNUTSState", "default_marginalized", "conditional_mode", "laplace_marginal",
           "theta_layout", "inner_hessian"]


class LaplaceNUTSState(NamedTuple):
    r"""``z``: every latent coordinate (``phi`` from NUTS, ``theta`` drawn given it), flat, in
    the LM bases; ``hmc``: NUTS's state over ``phi``; ``theta_mode``: the conditional mode at
    ``phi``; ``inner_failed``: its Newton solve did not converge or found no mode;
    ``diverging``, ``num_steps`` as NUTS reports them; ``rng_key`` for the draws of theta;
    ``log_correction``, ``correction_rejected``: delayed acceptance's :math:`c(\phi)` and verdict."""

    z: jnp.ndarray
    hmc: object
    theta_mode: jnp.ndarray
    inner_failed: jnp.ndarray
    diverging: jnp.ndarray
    num_steps: jnp.ndarray
    rng_key: jnp.ndarray
    log_correction: jnp.ndarray
    correction_rejected: jnp.ndarray


def default_marginalized(layout) -> list:
    """The latent field a default :class:`LaplaceNUTS` integrates out: every site inside a
    plate, and every multivariate-normal latent (a GP's values); the rest (global sites outside
    the plates) are the hyperparameters NUTS samples."""
    return [s.name for s in layout.sites if s.plates or s.prior == "MultivariateNormal"]


def _split(layout, marginalize):
    theta = [s for s in layout.sites if s.name in marginalize]
    phi = [s for s in layout.sites if s.name not in marginalize]
    index = lambda sites: np.concatenate([np.arange(s.offset, s.offset + s.size) for s in sites]) if sites else \
        np.zeros(0, int)
    return index(theta), index(phi)


def _joint(theta, phi, theta_index, phi_index, size):
    flat = jnp.zeros(size, jnp.result_type(theta, phi))
    return flat.at[theta_index].set(theta).at[phi_index].set(phi)


@partial(jax.custom_vjp, nondiff_argnums=(0, 3, 4, 5))
def conditional_mode(log_density, phi, theta0, tol, max_iter, hessian=DenseHessian()):
    r"""``(theta*, converged)``: the mode of ``log_density(theta, phi)`` in ``theta`` by Newton
    from ``theta0``, differentiable in ``phi`` by the implicit function theorem (module
    docstring); ``converged`` is False where the search stopped short or found no mode.
    ``hessian``: the search's Hessian strategy (:mod:`numpyro_lm.hessian`)."""
    return _solve(log_density, phi, theta0, tol, max_iter, hessian)


def _solve(log_density, phi, theta0, tol, max_iter, hessian):
    theta, ok, _ = _search(log_density, phi, theta0, tol, max_iter, hessian)
    return theta, ok


def _search(log_density, phi, theta0, tol, max_iter, hessian):
    """``(theta*, ok, the strategy's Hessian of -log p at theta*)``."""
    fn = lambda theta: log_density(theta, phi)
    state = laplace_update(fn, laplace_init(fn, theta0, hessian=hessian), tol=tol, max_iter=max_iter,
                           hessian=hessian)
    ok = state.converged & state.positive & jnp.isfinite(state.value)
    return state.x, ok & (state.structure_error <= structure_tol(state.x.dtype)), state.hess


def _mode_fwd(log_density, phi, theta0, tol, max_iter, hessian):
    theta, ok, hess = _search(log_density, phi, theta0, tol, max_iter, hessian)
    return (theta, ok), (theta, phi, hess)


def _mode_bwd(log_density, tol, max_iter, hessian, residual, cotangent):
    theta, phi, hess = residual  # the search's last Hessian is the one at its end point
    if isinstance(hessian, DenseHessian):
        u = jnp.linalg.solve(hess, cotangent[0])
    else:
        u = hessian.curvature(hess).solve(cotangent[0])
    # d theta*/d phi = H^-1 d2 log p / d theta d phi: its transpose applied to the cotangent
    grad_phi = jax.grad(lambda p: jnp.vdot(jax.grad(log_density)(theta, p), u))(phi)
    return grad_phi, jnp.zeros_like(theta)


conditional_mode.defvjp(_mode_fwd, _mode_bwd)


def laplace_marginal(log_density, phi, theta0, tol, max_iter, hessian=DenseHessian(), quadrature: bool = False,
                     batched: bool = False):
    r"""``(log p~(phi | y) up to a constant, theta*, the strategy's Hessian at theta*, ok)``
    (module docstring). Where the inner solve failed the value is ``-inf``. ``quadrature``:
    where the Hessian is block-arrowhead with scalar blocks (a random intercept per group),
    each block's integral by adaptive Gauss-Hermite quadrature instead of Laplace
    (:func:`~numpyro_lm.nested.quadrature.block_quadrature_correction`, differentiated like
    the rest; ``batched``: its gradients at once, see there)."""
    theta, ok = conditional_mode(log_density, phi, theta0, tol, max_iter, hessian)
    value, _, hess, _ = hessian.evaluate(lambda t: -log_density(t, phi), theta)
    half_logdet, positive = _half_logdet(hessian, hess)
    out = -value + 0.5 * theta.shape[-1] * jnp.log(2.0 * jnp.pi) - half_logdet
    if quadrature and scalar_blocks(hessian):
        out = out + _quadrature_correction(log_density, phi, theta, hessian, hess, batched)
    ok = ok & positive & jnp.isfinite(out)
    return jnp.where(ok, out, -jnp.inf), theta, hess, ok


def _quadrature_correction(log_density, phi, theta, hessian, hess, batched):
    r""":math:`c(\phi)`: the scalar blocks' Gauss-Hermite correction at the conditional mode."""
    return block_quadrature_correction(lambda t: log_density(t, phi), theta, hessian.structure.local_index[:, 0],
                                       hessian.curvature(hess).a[:, 0, 0], batched)


def _half_logdet(hessian, hess):
    """``(log det H / 2, H positive definite)``, differentiable: JAX's own Cholesky (the
    package's batched one has no derivative rule) or the arrowhead's block factor."""
    if isinstance(hessian, DenseHessian):
        chol = jnp.linalg.cholesky(hess)
        return jnp.sum(jnp.log(jnp.diagonal(chol))), jnp.all(jnp.isfinite(chol))
    curvature = hessian.curvature(hess)
    return 0.5 * curvature.logdet(), curvature.positive()


def theta_layout(layout, theta_sites) -> Layout:
    """The layout of the latent field alone (its sites, offsets counted within it): the
    structured curvatures (:mod:`numpyro_lm.hessian`) read its plates."""
    sites, offset = [], 0
    for s in layout.sites:
        if s.name in theta_sites:
            sites.append(s._replace(offset=offset))
            offset += s.size
    return Layout(tuple(sites), offset)


INNER_CURVATURES = ("auto", "dense", "arrowhead")
QUADRATURE_BATCH_MAX = 2**22
"""Numbers (latent and observed, times :data:`~numpyro_lm.nested.quadrature.GH_NODES`) up to
which the quadrature's gradients run at once (``vmap``): about 0.1 GB of a model's
intermediates in float32; above, one after another."""
INNER_ARROWHEAD_MIN_DIM = 32
"""Field coordinates above which ``"auto"`` takes a plate's block-arrowhead Hessian. Lower than
the joint fit's :data:`~numpyro_lm.hessian.ARROWHEAD_MIN_DIM`: the inner Hessian is formed at
every gradient of every leapfrog step, and differentiated (a GLMM with 100 groups: 2 coloured
Hessian-vector products instead of 100)."""


def inner_hessian(layout, curvature: str = "auto"):
    """The inner search's Hessian strategy: ``"dense"``, ``"arrowhead"`` (the field's plate),
    or ``"auto"``: the arrowhead above :data:`INNER_ARROWHEAD_MIN_DIM` field coordinates where
    a plate gives one (a GLMM's random effects: one block per group), else dense."""
    if curvature == "auto":
        structured = layout.size > INNER_ARROWHEAD_MIN_DIM and plate_structure(layout) is not None
        curvature = "arrowhead" if structured else "dense"
    hessian = hessian_for(layout, curvature)
    # warm-started searches rarely reject a trial: the value alone first would cost every
    # accepted one a forward pass more (a 1000-group GLMM's gradient: 1.5 -> 1.1 ms with the
    # linearised evaluation of numpyro_lm.hessian)
    return hessian._replace(value_first=False) if isinstance(hessian, ArrowheadHessian) else hessian


@lru_cache(maxsize=1)
def _nuts_options() -> frozenset:
    """The keyword options of NumPyro's ``hmc`` ``init_kernel`` a user may pass (read once)."""
    options = set(inspect.signature(hmc(potential_fn=lambda z: 0.0)[0]).parameters)
    return frozenset(options - {"init_params", "num_warmup", "model_args", "model_kwargs", "rng_key"})


class LaplaceNUTS(MCMCKernel):
    r"""NUTS over a model's hyperparameters on the Laplace marginal of its latent field
    (module docstring), used as ``MCMC(LaplaceNUTS(model), num_warmup=..., num_samples=...)``.

    :param model: a NumPyro model.
    :param marginalize: the latent sites integrated out by Laplace (default
        :func:`default_marginalized`: sites inside plates and multivariate-normal latents).
    :param dict bases, families: per-site LM bases and families, as in
        :class:`~numpyro_lm.LaplaceMatching`.
    :param float inner_tol: the inner Newton decrement tolerance (default: the package's for
        the precision, :func:`~numpyro_lm.optimize.default_tol`).
    :param int inner_max_iter: Newton evaluations per inner solve.
    :param str curvature: the inner Hessian (:func:`inner_hessian`): ``"auto"`` (default),
        ``"dense"`` or ``"arrowhead"`` (one block per entry of the field's plate: ``O(J)``).
        ``"auto"`` checks the arrowhead at the first point and takes the dense Hessian where
        the plate's entries interact (a GP's whitened field); ``"arrowhead"`` is refused there.
    :param quadrature: where the field is one scalar per plate entry given the
        hyperparameters (a random intercept per group: the arrowhead with scalar blocks), each
        entry's integral by adaptive Gauss-Hermite quadrature (lme4's ``nAGQ``): Laplace
        underestimates the spread of a binary group's integral and with it the variance
        component (Breslow and Lin 1995). ``True`` (default): in NUTS's potential, nine model
        gradients per leapfrog step; ``"delayed"``: the same target by delayed acceptance, nine
        per iteration (module docstring); ``False``: Laplace alone.
    :param init_strategy: a NumPyro init strategy for the first point (default
        ``init_to_median``: the prior's medians, where the latent field's conditional mode
        usually exists); ``MCMC.run(init_params=...)`` takes flat LM-basis coordinates instead.
    :param nuts_kwargs: options of NumPyro's NUTS (``target_accept_prob``, ``max_tree_depth``,
        ``dense_mass``, ``step_size``, ...: those of ``numpyro.infer.hmc.hmc``'s ``init_kernel``);
        ``potential_fn`` and ``model`` are this kernel's.
    """

    sample_field = "z"

    def __init__(self, model, marginalize: Optional[list] = None, *, bases: Optional[dict] = None,
                 families: Optional[dict] = None, inner_tol: Optional[float] = None, inner_max_iter: int = 50,
                 init_strategy=init_to_median, curvature: str = "auto", quadrature: bool = True, **nuts_kwargs):
        for name in ("potential_fn", "model"):
            if name in nuts_kwargs:
                raise TypeError(f"LaplaceNUTS builds its own {name}= from the model: drop it")
        options = _nuts_options()
        unknown = sorted(set(nuts_kwargs) - options)
        if unknown:
            raise TypeError(f"LaplaceNUTS: unknown NUTS option(s) {unknown}; the options are {sorted(options)}")
        if inner_max_iter < 1:
            raise ValueError(f"inner_max_iter must be positive, not {inner_max_iter}")
        if curvature not in INNER_CURVATURES:
            raise ValueError(f"curvature must be one of {INNER_CURVATURES}, not {curvature!r}")
        if not (quadrature is True or quadrature is False or quadrature == "delayed"):
            raise ValueError(f"quadrature must be True, False or 'delayed', not {quadrature!r}")
        self._model, self.marginalize = model, None if marginalize is None else list(marginalize)
        self.bases, self.families, self.inner_tol, self.inner_max_iter = bases, families, inner_tol, inner_max_iter
        self.nuts_kwargs, self.init_strategy, self.curvature = nuts_kwargs, init_strategy, curvature
        self.quadrature = quadrature
        self._info = self._kernels = self._split = self._theta0 = self._args = self._raw = self._hessian = None
        self._programs, self._vectorized = None, False

    @property
    def model(self):
        return self._model

    @property
    def default_fields(self):
        return ("z", "diverging")

    def __repr__(self):
        if self._split is None:
            chosen = "chosen at run()" if self.marginalize is None else self.marginalize
            return f"LaplaceNUTS(marginalize={chosen})"
        theta = [s.name for s in self._info.layout.sites if s.name in self._theta_sites]
        phi = [s.name for s in self._info.layout.sites if s.name not in self._theta_sites]
        return f"LaplaceNUTS(NUTS over {phi}, Laplace over {theta})"

    # ------------------------------------------------------------------ set-up
    def _setup(self, model_args, model_kwargs):
        # data a model uses in NumPy (a plate size from np.max(group) + 1) stay static, as
        # LaplaceMatching and MCMC keep them (numpyro_lm.static_data)
        raw = (model_args, model_kwargs)
        model_args, model_kwargs, info = static_where_needed(
            lambda a, k: model_info(self._model, a, k, bases=self.bases, families=self.families), tuple(model_args),
            dict(model_kwargs))
        names = [s.name for s in info.layout.sites]
        theta_sites = default_marginalized(info.layout) if self.marginalize is None else self.marginalize
        unknown = [n for n in theta_sites if n not in names]
        if unknown:
            raise ValueError(f"marginalize names {unknown}, which are not latent sites; the latent sites are {names}")
        if not theta_sites:
            raise ValueError("LaplaceNUTS: no latent site to integrate out (no site inside a plate, no multivariate "
                             "normal latent). Name them with marginalize=[...], or use NUTS itself.")
        if len(theta_sites) == len(names):
            raise ValueError(f"LaplaceNUTS: every latent site ({names}) would be integrated out, leaving no "
                             "hyperparameter for NUTS. Use LaplaceMatching(model) for the joint Laplace fit, or "
                             "name fewer sites in marginalize=.")
        self._info, self._theta_sites, self._args, self._raw = info, set(theta_sites), (model_args, model_kwargs), raw
        self._split = _split(info.layout, self._theta_sites)
        self._hessian = inner_hessian(theta_layout(info.layout, self._theta_sites), self.curvature)
        self._batched = GH_NODES * (info.layout.size + info.layout.observed_size) <= QUADRATURE_BATCH_MAX

    def _log_density(self, theta, phi):
        # by site, not scattered into one flat vector: the inner Hessian in theta then carries no
        # tangent through phi's computations (a kernel's Cholesky: 700x at n = 200)
        _, phi_index = self._split
        args, kwargs = self._args
        return self._info.log_density(site_values(self._info.layout, phi_index, phi, theta), args, kwargs)

    def _tol(self, dtype):
        return default_tol(dtype) if self.inner_tol is None else self.inner_tol

    def potential_energy(self, phi, theta_start=None, corrected: bool = True):
        """``-log p~(phi | y)`` (module docstring), the chain's target, its inner search
        started at ``theta_start`` (default: the conditional mode at the first point);
        ``corrected=False``: without the quadrature's correction (NUTS's own potential under
        delayed acceptance)."""
        theta_start = self._theta0 if theta_start is None else theta_start
        value, _, _, _ = laplace_marginal(self._log_density, phi, theta_start, self._tol(phi.dtype),
                                          self.inner_max_iter, self._hessian, bool(self.quadrature) and corrected,
                                          self._batched)
        return -value

    def _delayed(self) -> bool:  # the quadrature's correction by delayed acceptance
        return self.quadrature == "delayed" and scalar_blocks(self._hessian)

    def _correction(self, phi, mode, hess):
        r""":math:`c(\phi)` at the conditional mode (0 without delayed acceptance)."""
        if not self._delayed():
            return jnp.zeros((), phi.dtype)
        return _quadrature_correction(self._log_density, phi, mode, self._hessian, hess, self._batched)

    def _potential_at(self, theta_start):
        return partial(self._programs["potential"], theta_start=theta_start)

    def _compile(self):
        # one program each, not one per operation: called outside MCMC's compiled loop (at
        # init, by NUTS's step-size search) they would otherwise dispatch hundreds of small
        # programs (a GLMM with 1000 groups, 500 + 500: cold 31 s before, 19 s after; warm 16 s)
        hessian = self._hessian
        self._programs = dict(
            potential=jax.jit(lambda phi, theta_start: self.potential_energy(phi, theta_start,
                                                                             corrected=not self._delayed())),
            first_mode=jax.jit(lambda phi, theta: _solve(self._log_density, phi, theta, self._tol(phi.dtype),
                                                         10 * self.inner_max_iter, hessian)),
            state=jax.jit(self._state),
        )

    # ------------------------------------------------------------------ kernel
    def _same_inputs(self, model_args, model_kwargs) -> bool:
        if self._raw is None:
            return False
        old = jax.tree.leaves(self._raw)
        new = jax.tree.leaves((model_args, model_kwargs))
        return len(old) == len(new) and all(a is b for a, b in zip(old, new))

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        # the same data again (a second MCMC.run): keep the traced model and the compiled
        # potential, as MCMC keeps its compiled sampler
        fresh = not self._same_inputs(model_args, model_kwargs)
        if fresh:
            self._setup(model_args, model_kwargs)
        self._vectorized = not is_prng_key(rng_key)
        if not self._vectorized:
            return self._init_chain(rng_key, num_warmup, init_params, fresh)
        # chain_method="vectorized": a key per chain (as NumPyro's HMC takes them). The first
        # chain's start runs outside vmap, where the structure and the first mode can be checked
        first = None if init_params is None else jax.tree.map(lambda a: a[0], init_params)
        self._init_chain(rng_key[0], num_warmup, first, fresh)
        if init_params is None:
            return jax.vmap(lambda key: self._init_chain(key, num_warmup, None, False))(rng_key)
        return jax.vmap(lambda key, p: self._init_chain(key, num_warmup, p, False))(rng_key, init_params)

    def _init_chain(self, rng_key, num_warmup, init_params, fresh):
        theta_index, phi_index = self._split
        key_init, key_nuts, key_draw = jax.random.split(rng_key, 3)
        if init_params is None:
            flat = self._info.init(key_init, *self._args, init_strategy=self.init_strategy)
        else:
            flat = jnp.asarray(init_params)
        phi0 = flat[phi_index]
        # the inner searches start where the conditional mode at the first phi is
        theta_start = flat[theta_index]
        self._check_structure(phi0, theta_start)
        if fresh or self._kernels is None:
            self._compile()
            self._kernels = hmc(potential_fn_gen=self._potential_at, algo="NUTS")
        theta0, ok = self._programs["first_mode"](phi0, theta_start)
        if not isinstance(ok, jax.core.Tracer):  # checkable outside vmapped chains
            if not bool(ok):
                raise FloatingPointError("LaplaceNUTS: the conditional mode of the latent field at the initial "
                                         "hyperparameters was not found (Newton did not converge or the Hessian is "
                                         "not negative definite there). Pass init_params or raise inner_max_iter.")
            self._theta0 = theta0
        init_kernel, _ = self._kernels
        state = init_kernel(phi0, num_warmup, model_args=(theta0,), rng_key=key_nuts, **self.nuts_kwargs)
        return self._programs["state"](state, theta0, key_draw)

    def _check_structure(self, phi, theta):
        """The arrowhead's probe at the first point (where it can be read: not inside vmapped
        chains): ``"auto"`` moves to the dense inner Hessian where the plate's entries interact
        (a GP's whitened field, ``f = L z``); an explicit ``"arrowhead"`` is refused, named."""
        if isinstance(self._hessian, DenseHessian) or not self._hessian.check or isinstance(phi, jax.core.Tracer):
            return  # dense, checked already (a second run or chain), or not readable here
        hessian = self._hessian
        error = float(jax.jit(lambda p, t: hessian.evaluate(lambda x: -self._log_density(x, p), t)[3])(phi, theta))
        if error <= structure_tol(theta.dtype):
            # whether entries interact is the model's, not the point's: the searches skip the probe
            self._hessian = self._hessian._replace(check=False)
            return
        if self.curvature == "auto":
            self._hessian = DenseHessian()
            return
        raise ValueError(f"LaplaceNUTS(curvature='arrowhead'): the latent field's plate entries interact (the "
                         f"block-arrowhead Hessian is off by {error:.1e} on a random probe, relative; the limit is "
                         f"{structure_tol(theta.dtype):.0e}): a likelihood or prior couples them (a GP's whitened "
                         "field f = L z). Pass curvature='dense' or 'auto'.")

    def _mode(self, phi, theta_start):
        # the mode and its Hessian are all a draw needs: not the marginal's value or log-determinant
        return _search(self._log_density, phi, theta_start, self._tol(phi.dtype), self.inner_max_iter, self._hessian)

    def _found(self, phi, theta_start):  # (mode, ok, hess, c(phi))
        mode, ok, hess = self._mode(phi, theta_start)
        return mode, ok, hess, self._correction(phi, mode, hess)

    def _state(self, hmc_state, theta_start, rng_key, found=None, rejected=None):
        """The chain's state at NUTS's point: the conditional mode there (``found``: already
        searched, ``(mode, ok, hess, correction)``), one draw of theta, the correction."""
        theta_index, phi_index = self._split
        phi = hmc_state.z
        mode, ok, hess, correction = found if found is not None else self._found(phi, theta_start)
        rng_key, key = jax.random.split(rng_key)
        eps = jax.random.normal(key, mode.shape, mode.dtype)
        theta = mode + self._hessian.curvature(hess).inv_sqrt(eps)  # N(mode, H^-1)
        z = _joint(theta, phi, theta_index, phi_index, self._info.size)
        # a failed solve at a kept point (it cannot be one: its potential is infinite) keeps the last start
        mode = jnp.where(ok, mode, theta_start)
        rejected = jnp.zeros((), bool) if rejected is None else rejected
        return LaplaceNUTSState(z, hmc_state, mode, ~ok, hmc_state.diverging, hmc_state.num_steps, rng_key,
                                correction, rejected)

    def sample(self, state, model_args, model_kwargs):
        return jax.vmap(self._sample_chain)(state) if self._vectorized else self._sample_chain(state)

    def _sample_chain(self, state):
        _, sample_kernel = self._kernels
        proposed = sample_kernel(state.hmc, model_args=(state.theta_mode,))
        if not self._delayed():
            return self._state(proposed, state.theta_mode, state.rng_key)
        # delayed acceptance (module docstring): NUTS's move on the Laplace marginal is kept
        # with probability exp(c(phi') - c(phi)); a failed inner solve there is turned down
        mode, ok, hess, correction = self._found(proposed.z, state.theta_mode)
        rng_key, key = jax.random.split(state.rng_key)
        log_u = jnp.log(jax.random.uniform(key, (), correction.dtype))
        accept = ok & jnp.isfinite(correction) & (log_u < correction - state.log_correction)
        old = state.hmc
        # turned down: NUTS's point, gradient and potential go back; its adaptation and key go on
        hmc_state = proposed._replace(
            z=jnp.where(accept, proposed.z, old.z), z_grad=jnp.where(accept, proposed.z_grad, old.z_grad),
            potential_energy=jnp.where(accept, proposed.potential_energy, old.potential_energy))
        found = jax.lax.cond(accept, lambda: (mode, ok, hess, correction),
                             lambda: (*self._mode(old.z, state.theta_mode), state.log_correction))
        return self._state(hmc_state, state.theta_mode, rng_key, found, ~accept)

    def postprocess_fn(self, model_args, model_kwargs):
        info, (args, kwargs) = self._info, self._args  # the data as traced at set-up (static where needed)

        def constrain(z):
            return info.constrain(z, args, kwargs)

        return constrain

    def get_diagnostics_str(self, state):
        return "{} steps of size {:.2e}. acc. prob={:.2f}".format(
            state.hmc.num_steps, state.hmc.adapt_state.step_size, state.hmc.mean_accept_prob)

r"""Laplace-marginal NUTS: NUTS over the hyperparameters, Laplace over the latent field.

NUTS samples a model's hyperparameters :math:`\phi` from the Laplace marginal of its latent
field :math:`\theta` (:mod:`numpyro_lm.laplace_marginal`: the inner Newton search, the
implicit gradient), and each of its draws gets one draw of :math:`\theta`.

Where the field is one scalar per plate entry given :math:`\phi` (a random intercept per
group), the target is the Gauss-Hermite-corrected marginal
:math:`\tilde p_L(\phi \mid y)\,e^{c(\phi)}` (:func:`~numpyro_lm.laplace_marginal.quadrature_correction`):
Laplace alone puts a binary GLMM's variance component low. The correction costs 25 model
gradients (:data:`~numpyro_lm.nested.quadrature.SLOPE_POINTS`); taken at every leapfrog step
(``quadrature="potential"``) it is most of each step's cost. The default reaches the same
target by *delayed acceptance* (Christen and Fox 2005) with a *tilt*: NUTS moves on
:math:`\tilde p_L(\phi)\,e^{g^\top\phi}`, and its move :math:`\phi \to \phi'` is kept with
probability

.. math:: \min\bigl(1,\; e^{r(\phi') - r(\phi)}\bigr), \qquad r(\phi) = c(\phi) - g^\top\phi,

which leaves the corrected target invariant exactly for any :math:`g`, because the NUTS move
is reversible for the tilted target. The correction is evaluated once an iteration, at the
move's end. :math:`g` is the least-squares slope of the correction's change on the move,
:math:`\Delta c \approx g^\top \Delta\phi`, over the moves NUTS proposed during recent
warm-up iterations, kept or turned down (:func:`tilt_from_moves`): it makes the log
acceptance ratio :math:`\Delta c - g^\top\Delta\phi` as small as a linear tilt can over the
moves the chain makes, so hardly a move is turned down (on the 1000-group GLMM, 0-0.2% against
11% untilted, which lost half the ESS). Moves are local, so where the chain is still on its
way to the posterior the slope is the local one; and a poor tilt, under which most moves
are turned down, still sees NUTS's proposals and is mended at the next re-take. It is
re-taken at warm-up iterations 1, 2, 4, 8, ... and at the last, from the moves since the last
re-take once they number :data:`TILT_MIN_MOVES` per hyperparameter (zero until then), then
fixed for the draws (a NUTS kernel whose target moved during sampling would not be
reversible). The slope comes from values of :math:`c` the chain computes anyway: no
derivative of the quadrature is compiled into the sampling loop, which NumPyro compiles again
at every ``run()`` (the correction's gradient it replaced cost 1 s of compilation on that
GLMM, and 5 ms a call).

Each NUTS step starts its inner searches at the previous step's :math:`\theta^*`
(NumPyro's functional ``hmc`` regenerates the potential from arguments each step, which
carry it and the tilt), so a search takes a few Newton steps where :math:`\phi` moved a little.

After each NUTS step, one draw of :math:`\theta` comes from the conditional Laplace
Gaussian :math:`N(\theta^*(\phi), H(\phi)^{-1})` in the basis, so the chain holds every
latent site, constrained, as NUTS's would.

An inner solve that does not converge, or stops where :math:`H` is not positive definite,
gives an infinite potential: NUTS counts the trajectory as divergent and does not move
there (under delayed acceptance, the move is turned down). The state records whether the
solve at each kept draw converged (``inner_failed``), so
``MCMC(..., extra_fields=("inner_failed",))`` counts them.
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

from .hessian import DenseHessian, structure_tol
from .laplace_marginal import (INNER_CURVATURES, QUADRATURE_BATCH_MAX, inner_hessian, laplace_marginal, mode_search,
                               quadrature_correction, theta_layout)
from .model import model_info
from .nested.inner import scalar_blocks
from .nested.quadrature import SLOPE_POINTS
from .optimize import default_tol
from .static_data import static_where_needed
from .trace import site_values

__all__ = ["LaplaceNUTS", "LaplaceNUTSState", "default_marginalized", "tilt_from_moves"]

TILT_MIN_MOVES = 2
"""Proposed moves per hyperparameter a tilt's slope needs (:func:`tilt_from_moves`); fewer, and
they gather on until the next re-take."""


class LaplaceNUTSState(NamedTuple):
    r"""``z``: every latent coordinate (``phi`` from NUTS, ``theta`` drawn given it), flat, in
    the LM bases; ``hmc``: NUTS's state over ``phi``; ``theta_mode``: the conditional mode at
    ``phi``; ``theta_hess``: the inner Hessian there (the strategy's, :mod:`numpyro_lm.hessian`);
    ``inner_failed``: its Newton solve did not converge or found no mode;
    ``diverging``, ``num_steps`` as NUTS reports them; ``rng_key`` for the draws of theta;
    ``log_correction``, ``correction_rejected``, ``tilt``: delayed acceptance's :math:`c(\phi)`,
    verdict and :math:`g` (module docstring); ``tilt_moves``: the sums
    :func:`tilt_from_moves` reads, over the warm-up moves proposed since the last tilt."""

    z: jnp.ndarray
    hmc: object
    theta_mode: jnp.ndarray
    theta_hess: object
    inner_failed: jnp.ndarray
    diverging: jnp.ndarray
    num_steps: jnp.ndarray
    rng_key: jnp.ndarray
    log_correction: jnp.ndarray
    correction_rejected: jnp.ndarray
    tilt: jnp.ndarray
    tilt_moves: tuple


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
        component (Breslow and Lin 1995). ``True`` (default): by tilted delayed acceptance, 25
        model gradients an iteration (module docstring); ``"potential"``: the same target in
        NUTS's potential, 25 gradients and their derivative per leapfrog step; ``False``:
        Laplace alone.
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
                 init_strategy=init_to_median, curvature: str = "auto", quadrature=True, **nuts_kwargs):
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
        if not (quadrature is True or quadrature is False or quadrature == "potential"):
            raise ValueError(f"quadrature must be True, False or 'potential', not {quadrature!r}")
        self._model, self.marginalize = model, None if marginalize is None else list(marginalize)
        self.bases, self.families, self.inner_tol, self.inner_max_iter = bases, families, inner_tol, inner_max_iter
        self.nuts_kwargs, self.init_strategy, self.curvature = nuts_kwargs, init_strategy, curvature
        self.quadrature = quadrature
        self._info = self._kernels = self._split = self._theta0 = self._args = self._raw = self._hessian = None
        self._programs, self._vectorized, self._num_warmup = None, False, 0

    @property
    def model(self):
        return self._model

    @property
    def default_fields(self):
        return ("z", "diverging")

    @property
    def split(self) -> Optional[tuple]:
        """``(the hyperparameters NUTS samples, the sites Laplace integrates out)``, site names
        in the model's order, once ``run()`` has traced the model; ``None`` before."""
        if self._split is None:
            return None
        names = [s.name for s in self._info.layout.sites]
        return [n for n in names if n not in self._theta_sites], [n for n in names if n in self._theta_sites]

    def __repr__(self):
        if self._split is None:
            chosen = "chosen at run()" if self.marginalize is None else self.marginalize
            return f"LaplaceNUTS(marginalize={chosen})"
        phi, theta = self.split
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
        self._batched = SLOPE_POINTS * (info.layout.size + info.layout.observed_size) <= QUADRATURE_BATCH_MAX

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
        ``corrected=False``: without the quadrature's correction (the Laplace marginal alone)."""
        theta_start = self._theta0 if theta_start is None else theta_start
        value, _, _, _ = laplace_marginal(self._log_density, phi, theta_start, self._tol(phi.dtype),
                                          self.inner_max_iter, self._hessian, bool(self.quadrature) and corrected,
                                          self._batched)
        return -value

    def _delayed(self) -> bool:  # the quadrature's correction by delayed acceptance
        return self.quadrature is True and scalar_blocks(self._hessian)

    def _correction(self, phi, mode, hess):
        r""":math:`c(\phi)` at the conditional mode (0 without delayed acceptance)."""
        if not self._delayed():
            return jnp.zeros((), phi.dtype)
        return quadrature_correction(self._log_density, phi, mode, self._hessian, hess, self._batched)

    def _potential_at(self, theta_start, tilt):
        return partial(self._programs["potential"], theta_start=theta_start, tilt=tilt)

    def _compile(self):
        # one program each, not one per operation: called outside MCMC's compiled loop (at
        # init, by NUTS's step-size search) they would otherwise dispatch hundreds of small
        # programs (a GLMM with 1000 groups, 500 + 500: cold 31 s before, 19 s after; warm 16 s)
        hessian = self._hessian
        self._programs = dict(
            potential=jax.jit(lambda phi, theta_start, tilt: self.potential_energy(
                phi, theta_start, corrected=not self._delayed()) - jnp.dot(tilt, phi)),
            first_mode=jax.jit(lambda phi, theta: mode_search(self._log_density, phi, theta, self._tol(phi.dtype),
                                                              10 * self.inner_max_iter, hessian)[:2]),
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
        if self._vectorized:
            # chain_method="vectorized": a key per chain (as NumPyro's HMC takes them). The
            # first chain's start is read outside vmap, where the structure and the first
            # mode can be checked
            first = None if init_params is None else jax.tree.map(lambda a: a[0], init_params)
            self._first_point(_chain_keys(rng_key[0])[0], first, fresh)
            if init_params is None:
                return jax.vmap(lambda key: self._init_chain(key, num_warmup, None, False))(rng_key)
            return jax.vmap(lambda key, p: self._init_chain(key, num_warmup, p, False))(rng_key, init_params)
        if isinstance(rng_key, jax.core.Tracer) and (fresh or self._theta0 is None):
            # a chain inside pmap (chain_method="parallel"): its key and start cannot be read,
            # so the structure and the first mode are checked once, eagerly, at a start the
            # init strategy gives (the model's arguments are not mapped)
            with jax.ensure_compile_time_eval():
                self._first_point(jax.random.PRNGKey(0), None, fresh)
            fresh = False
        return self._init_chain(rng_key, num_warmup, init_params, fresh)

    def _init_chain(self, rng_key, num_warmup, init_params, fresh):
        key_init, key_nuts, key_draw = _chain_keys(rng_key)
        phi0, theta0 = self._first_point(key_init, init_params, fresh)
        init_kernel, _ = self._kernels
        self._num_warmup = num_warmup
        tilt = jnp.zeros_like(phi0)  # until the chain's points give a slope (module docstring)
        state = init_kernel(phi0, num_warmup, model_args=(theta0, tilt), rng_key=key_nuts, **self.nuts_kwargs)
        return self._programs["state"](state, theta0, key_draw, tilt)

    def _first_point(self, key_init, init_params, fresh):
        """``(phi0, the conditional mode there)`` of a chain's start (``init_params`` or the init
        strategy's), with the structure and the mode checked where they can be read (not
        inside mapped chains); the programs compiled where the model is ``fresh``."""
        theta_index, phi_index = self._split
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
        if not isinstance(ok, jax.core.Tracer):  # checkable outside mapped chains
            if not bool(ok):
                raise FloatingPointError("LaplaceNUTS: the conditional mode of the latent field at the initial "
                                         "hyperparameters was not found (Newton did not converge or the Hessian is "
                                         "not negative definite there). Pass init_params or raise inner_max_iter.")
            self._theta0 = theta0
        return phi0, theta0

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
        return mode_search(self._log_density, phi, theta_start, self._tol(phi.dtype), self.inner_max_iter,
                           self._hessian)

    def _found(self, phi, theta_start):  # (mode, ok, hess, c(phi))
        mode, ok, hess = self._mode(phi, theta_start)
        return mode, ok, hess, self._correction(phi, mode, hess)

    def _state(self, hmc_state, theta_start, rng_key, tilt, found=None, rejected=None, moves=None):
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
        moves = _no_moves(phi) if moves is None else moves
        return LaplaceNUTSState(z, hmc_state, mode, hess, ~ok, hmc_state.diverging, hmc_state.num_steps, rng_key,
                                correction, rejected, tilt, moves)

    def sample(self, state, model_args, model_kwargs):
        return jax.vmap(self._sample_chain)(state) if self._vectorized else self._sample_chain(state)

    def _sample_chain(self, state):
        _, sample_kernel = self._kernels
        if not self._delayed():
            proposed = sample_kernel(state.hmc, model_args=(state.theta_mode, state.tilt))
            return self._state(proposed, state.theta_mode, state.rng_key, state.tilt, moves=state.tilt_moves)
        # the tilt is re-taken at warm-up iterations 1, 2, 4, ... and the last, then fixed
        i, moves = state.hmc.i, state.tilt_moves
        warming = i < self._num_warmup
        retilt = warming & (moves[2] >= TILT_MIN_MOVES * state.tilt.size) & (
            ((i & (i - 1)) == 0) | (i == self._num_warmup - 1))
        tilt, old = jax.lax.cond(retilt, lambda: self._retilted(state), lambda: (state.tilt, state.hmc))
        moves = jax.tree.map(lambda fresh, kept: jnp.where(retilt, fresh, kept), _no_moves(state.tilt), moves)
        proposed = sample_kernel(old, model_args=(state.theta_mode, tilt))
        # delayed acceptance (module docstring): NUTS's move on the tilted Laplace marginal is
        # kept with probability exp(r(phi') - r(phi)), r = c - tilt . phi; a failed inner solve
        # there is turned down
        mode, ok, hess, correction = self._found(proposed.z, state.theta_mode)
        rng_key, key = jax.random.split(state.rng_key)
        log_u = jnp.log(jax.random.uniform(key, (), correction.dtype))
        log_ratio = correction - state.log_correction - jnp.dot(tilt, proposed.z - old.z)
        accept = ok & jnp.isfinite(correction) & (log_u < log_ratio)
        moves = _moves_added(moves, proposed.z - old.z, correction - state.log_correction,
                             warming & ok & jnp.isfinite(correction))
        # turned down: NUTS's point, gradient and potential go back; its adaptation and key go on
        hmc_state = proposed._replace(
            z=jnp.where(accept, proposed.z, old.z), z_grad=jnp.where(accept, proposed.z_grad, old.z_grad),
            potential_energy=jnp.where(accept, proposed.potential_energy, old.potential_energy))
        # turned down, the chain stays where its state's mode and Hessian are: no second search
        found = jax.lax.cond(accept, lambda: (mode, ok, hess, correction),
                             lambda: (state.theta_mode, jnp.ones((), bool), state.theta_hess, state.log_correction))
        return self._state(hmc_state, state.theta_mode, rng_key, tilt, found, ~accept, moves)

    def _retilted(self, state):
        """``(g, NUTS's state)``: the slope of :math:`c` over the recent moves
        (:func:`tilt_from_moves`), and NUTS's potential and its gradient at the chain's point
        moved from the old tilt to it (NUTS's potential is the Laplace marginal's minus ``tilt . phi``)."""
        tilt = _finite_or(tilt_from_moves(state.tilt_moves), state.tilt)
        shift = state.tilt - tilt
        hmc_state = state.hmc._replace(potential_energy=state.hmc.potential_energy + jnp.dot(shift, state.hmc.z),
                                       z_grad=state.hmc.z_grad + shift)
        return tilt, hmc_state

    def postprocess_fn(self, model_args, model_kwargs):
        info, (args, kwargs) = self._info, self._args  # the data as traced at set-up (static where needed)

        def constrain(z):
            return info.constrain(z, args, kwargs)

        return constrain

    def get_diagnostics_str(self, state):
        return "{} steps of size {:.2e}. acc. prob={:.2f}".format(
            state.hmc.num_steps, state.hmc.adapt_state.step_size, state.hmc.mean_accept_prob)


def _chain_keys(rng_key):
    """A chain's keys: for its start (the init strategy), NUTS, and the draws of theta."""
    return jax.random.split(rng_key, 3)


def _no_moves(phi):
    """``(S, b, n)``: no moves yet (:func:`tilt_from_moves`)."""
    return jnp.zeros((phi.size, phi.size), phi.dtype), jnp.zeros_like(phi), jnp.zeros((), jnp.int32)


def _moves_added(moves, step, change, counted):
    """``moves`` with the move ``step`` (of phi) and its ``change`` (of c) added where ``counted``."""
    s, b, n = moves
    step, change = jnp.where(counted, step, 0.0), jnp.where(counted, change, 0.0)
    return s + jnp.outer(step, step), b + step * change, n + counted.astype(n.dtype)


def tilt_from_moves(moves):
    r"""The least-squares slope :math:`g` of the correction's change on the move,
    :math:`\Delta c \approx g^\top\Delta\phi`, from the sums :math:`S = \sum \Delta\phi\,\Delta\phi^\top`
    and :math:`b = \sum \Delta\phi\,\Delta c` over moves: :math:`g = S^{-1} b`, which makes
    :math:`\sum (\Delta c - g^\top\Delta\phi)^2`, the squared log acceptance ratios of delayed
    acceptance (module docstring), least. A relative ridge of 1e-6 keeps a direction no move
    took from a slope."""
    s, b, _ = moves
    ridge = 1e-6 * jnp.maximum(jnp.trace(s) / s.shape[0], jnp.finfo(s.dtype).tiny)
    return jnp.linalg.solve(s + ridge * jnp.eye(s.shape[0], dtype=s.dtype), b)


def _finite_or(tilt, fallback):
    """``tilt`` where every entry is finite, else ``fallback`` (the delayed acceptance stays exact
    for any finite tilt; a slope from moves that never left a point, a singular ``S``, is not one)."""
    return jnp.where(jnp.all(jnp.isfinite(tilt)), tilt, fallback)

r"""Laplace-marginal NUTS: NUTS over the hyperparameters, Laplace over the latent field.

NUTS samples a model's hyperparameters :math:`\phi` from the Laplace marginal of its latent
field :math:`\theta` (:mod:`numpyro_lm.marginal.laplace_marginal`: the inner Newton search, the
implicit gradient), and each of its draws gets one draw of :math:`\theta`.

Where the field is one scalar per plate entry given :math:`\phi` (a random intercept per
group), the target is the Gauss-Hermite-corrected marginal
:math:`\tilde p_L(\phi \mid y)\,e^{c(\phi)}` (:func:`~numpyro_lm.marginal.laplace_marginal.quadrature_correction`):
Laplace alone puts a binary GLMM's variance component low. The correction costs 25 model
gradients (:data:`~numpyro_lm.marginal.quadrature.SLOPE_POINTS`); taken at every leapfrog step
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
at every ``run()`` (the correction's gradient, which the slope replaced, cost compile time at
every run and a quadrature's derivative at every iteration).

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

The kernel's steps are pure functions over an immutable target (:mod:`.tilted_nuts`);
:class:`LaplaceNUTS` is the NumPyro ``MCMCKernel`` that builds the target from the model and
drives them, as NumPyro's ``NUTS`` drives ``hmc()``.
"""

from __future__ import annotations

import inspect
from functools import lru_cache, partial
from typing import Optional

import jax
import jax.numpy as jnp
from numpyro.infer import init_to_median, init_to_value
from numpyro.infer.hmc import hmc
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import is_prng_key

from ..checks.covariance import failure_cause
from ..checks.validation import check_init_params
from ..core.model import model_info
from ..core.trace import site_values
from ..marginal.block_terms import conditional_block_values, scalar_block_entries
from ..marginal.laplace_marginal import INNER_CURVATURES, QUADRATURE_BATCH_MAX, inner_hessian, mode_search, theta_layout
from ..marginal.quadrature import SLOPE_POINTS
from ..mode.hessian import DenseHessian, structure_tol
from ..mode.newton import default_tol
from ..runtime.precision import precise_jit
from ..runtime.static_data import static_where_needed
from .tilted_nuts import (MarginalTarget, chain_keys, chain_state, default_marginalized, potential_energy, sample_chain,
                          split_coordinates)

__all__ = ["LaplaceNUTS"]  # its state and pure functions: .tilted_nuts


@lru_cache(maxsize=1)
def _nuts_options() -> frozenset:
    """The keyword options of NumPyro's ``hmc`` ``init_kernel`` a user may pass (read once)."""
    options = set(inspect.signature(hmc(potential_fn=lambda z: 0.0)[0]).parameters)
    return frozenset(options - {"init_params", "num_warmup", "model_args", "model_kwargs", "rng_key"})


def _conditional_log_density(info, phi_index, args, kwargs, theta, phi):
    # by site, not scattered into one flat vector: the inner Hessian in theta then carries no
    # tangent through phi's computations (a GP kernel's Cholesky factor, differentiated once per
    # field coordinate otherwise)
    return info.log_density(site_values(info.layout, phi_index, phi, theta), args, kwargs)


def _inside_mapped_chain(rng_key) -> bool:
    """A chain whose key cannot be read: NumPyro runs each chain's init inside ``pmap``
    (``chain_method="parallel"``)."""
    return isinstance(rng_key, jax.core.Tracer)


class LaplaceNUTS(MCMCKernel):
    r"""NUTS over a model's hyperparameters on the Laplace marginal of its latent field
    (module docstring), used as ``MCMC(LaplaceNUTS(model), num_warmup=..., num_samples=...)``.

    :param model: a NumPyro model.
    :param marginalize: the latent sites integrated out by Laplace (default
        :func:`default_marginalized`: sites inside plates and multivariate-normal latents).
    :param dict bases, families: per-site LM bases and families, as in
        :class:`~numpyro_lm.LaplaceMatching`.
    :param float inner_tol: the inner Newton decrement tolerance (default: the package's for
        the precision, :func:`~numpyro_lm.mode.newton.default_tol`).
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
        usually exists); ``MCMC.run(init_params=...)`` takes ``{site: constrained value}`` for
        every latent site (as :meth:`~numpyro_lm.LaplaceMatching.run`) or their flat LM-basis
        coordinates (with a leading chain axis for ``chain_method="vectorized"``).
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
        self._info = self._target = self._kernels = self._theta0 = self._args = self._raw = None
        self._theta_sites, self._programs, self._vectorized, self._num_warmup = None, None, False, 0

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
        if self._target is None:
            return None
        names = [s.name for s in self._info.layout.sites]
        return [n for n in names if n not in self._theta_sites], [n for n in names if n in self._theta_sites]

    @property
    def inner_hessian(self):
        """The inner searches' Hessian strategy (:mod:`numpyro_lm.mode.hessian`), as the first point
        settled it; ``None`` before ``run()``."""
        return None if self._target is None else self._target.hessian

    def __repr__(self):
        if self._target is None:
            chosen = "chosen at run()" if self.marginalize is None else self.marginalize
            return f"LaplaceNUTS(marginalize={chosen})"
        phi, theta = self.split
        return f"LaplaceNUTS(NUTS over {phi}, Laplace over {theta})"

    # ------------------------------------------------------------------ set-up
    def _setup(self, model_args, model_kwargs):
        # data a model uses in NumPy (a plate size from np.max(group) + 1) stay static, as
        # LaplaceMatching and MCMC keep them (numpyro_lm.runtime.static_data)
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
        theta_index, phi_index = split_coordinates(info.layout, set(theta_sites))
        inner_tol = self.inner_tol
        hessian = inner_hessian(theta_layout(info.layout, set(theta_sites)), self.curvature)
        self._target = MarginalTarget(
            partial(_conditional_log_density, info, phi_index, model_args, model_kwargs), theta_index, phi_index,
            info.layout.size, hessian,
            lambda dtype: default_tol(dtype) if inner_tol is None else inner_tol, self.inner_max_iter, self.quadrature,
            SLOPE_POINTS * (info.layout.size + info.layout.observed_size) <= QUADRATURE_BATCH_MAX,
            self._block_values(info, hessian, theta_index, phi_index, model_args, model_kwargs))
        self._info, self._theta_sites, self._args, self._raw = info, set(theta_sites), (model_args, model_kwargs), raw

    def _block_values(self, info, hessian, theta_index, phi_index, model_args, model_kwargs):
        """Each scalar block's own terms (:mod:`~numpyro_lm.marginal.block_terms`) for the
        quadrature, or ``None`` (no quadrature, no scalar blocks, or no per-block entries)."""
        entries = scalar_block_entries(info, hessian, theta_index, model_args, model_kwargs) if self.quadrature else None
        if entries is None:
            return None

        def values(theta, phi):
            return conditional_block_values(info, phi_index, phi, theta, model_args, model_kwargs, *entries)

        return values

    def potential_energy(self, phi, theta_start=None, corrected: bool = True):
        """``-log p~(phi | y)`` (module docstring), the chain's target, its inner search
        started at ``theta_start`` (default: the conditional mode at the first point);
        ``corrected=False``: without the quadrature's correction (the Laplace marginal alone)."""
        return potential_energy(self._target, phi, self._theta0 if theta_start is None else theta_start, corrected)

    def _compile(self):
        # one program each, not one per operation: called outside MCMC's compiled loop (at
        # init, by NUTS's step-size search) they would otherwise dispatch hundreds of small
        # programs (benchmarks/laplace_nuts.py measures the GLMM of 1000 groups)
        target = self._target
        self._programs = dict(
            potential=precise_jit(lambda phi, theta_start, tilt: potential_energy(
                target, phi, theta_start, corrected=not target.delayed) - jnp.dot(tilt, phi)),
            first_mode=precise_jit(lambda phi, theta: mode_search(target.log_density, phi, theta, target.tol(phi.dtype),
                                                              10 * target.max_iter, target.hessian)[:2]),
            state=precise_jit(partial(chain_state, target)),
        )
        potential = self._programs["potential"]
        self._kernels = hmc(potential_fn_gen=lambda theta_start, tilt: partial(potential, theta_start=theta_start,
                                                                              tilt=tilt), algo="NUTS")

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
            self._first_point(chain_keys(rng_key[0])[0], first, fresh)
            if init_params is None:
                return jax.vmap(lambda key: self._init_chain(key, num_warmup, None, False))(rng_key)
            return jax.vmap(lambda key, p: self._init_chain(key, num_warmup, p, False))(rng_key, init_params)
        if _inside_mapped_chain(rng_key) and (fresh or self._theta0 is None):
            # its key and start cannot be read, so the structure and the first mode are checked
            # once, eagerly, at a start the init strategy gives (the model's arguments are not mapped)
            with jax.ensure_compile_time_eval():
                self._first_point(jax.random.PRNGKey(0), None, fresh)
            fresh = False
        return self._init_chain(rng_key, num_warmup, init_params, fresh)

    def _init_chain(self, rng_key, num_warmup, init_params, fresh):
        key_init, key_nuts, key_draw = chain_keys(rng_key)
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
        target = self._target
        flat = self._start(key_init, init_params)
        phi0 = flat[target.phi_index]
        # the inner searches start where the conditional mode at the first phi is
        theta_start = flat[target.theta_index]
        if not isinstance(phi0, jax.core.Tracer):  # readable: not inside vmapped chains
            self._target = target._replace(hessian=self._checked_hessian(target, phi0, theta_start))
        if fresh or self._kernels is None:
            self._compile()
        theta0, ok = self._programs["first_mode"](phi0, theta_start)
        if not isinstance(ok, jax.core.Tracer):  # checkable outside mapped chains
            if not bool(ok):
                problem = failure_cause(self._info, *self._args)  # the data's or the prior's, named as run() names it
                if problem is not None:
                    raise problem
                raise FloatingPointError("LaplaceNUTS: the conditional mode of the latent field at the initial "
                                         "hyperparameters was not found (Newton did not converge or the Hessian is "
                                         "not negative definite there). Pass init_params or raise inner_max_iter.")
            self._theta0 = theta0
        return phi0, theta0

    def _start(self, key_init, init_params):
        """Flat LM-basis coordinates of a chain's start: the init strategy's, ``init_params`` as
        ``{site: constrained value}`` (as ``LaplaceMatching.run`` takes them; every latent site,
        hyperparameters and field) or as the flat coordinates themselves (length checked)."""
        layout = self._info.layout
        if init_params is None:
            return self._info.init(key_init, *self._args, init_strategy=self.init_strategy)
        if isinstance(init_params, dict):
            if not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(init_params)):
                check_init_params(init_params, layout)
            return self._info.init(key_init, *self._args, init_strategy=init_to_value(values=init_params))
        flat = jnp.asarray(init_params)
        if flat.shape != (layout.size,):
            sites = ", ".join(f"{s.name} ({s.size})" for s in layout.sites)
            raise ValueError(f"LaplaceNUTS: init_params of shape {flat.shape}; flat LM-basis coordinates of every "
                             f"latent site are a vector of {layout.size} ({sites}), hyperparameters and field "
                             "alike. Or pass a dict {site: constrained value}, as LaplaceMatching.run takes.")
        return flat

    def _checked_hessian(self, target: MarginalTarget, phi, theta):
        """The inner Hessian strategy after the arrowhead's probe at the first point: ``"auto"``
        moves to the dense inner Hessian where the plate's entries interact (a GP's whitened
        field, ``f = L z``); an explicit ``"arrowhead"`` is refused, named. Whether entries
        interact is the model's, not the point's: a strategy that passed skips the probe after."""
        hessian = target.hessian
        if not hessian.check:
            return hessian  # dense, or checked already (a second run or chain)
        error = float(precise_jit(lambda p, t: hessian.evaluate(lambda x: -target.log_density(x, p), t)[3])(phi, theta))
        if error <= structure_tol(theta.dtype):
            return hessian._replace(check=False)
        if self.curvature == "auto":
            return DenseHessian()
        raise ValueError(f"LaplaceNUTS(curvature='arrowhead'): the latent field's plate entries interact (the "
                         f"block-arrowhead Hessian is off by {error:.1e} on a random probe, relative; the limit is "
                         f"{structure_tol(theta.dtype):.0e}): a likelihood or prior couples them (a GP's whitened "
                         "field f = L z). Pass curvature='dense' or 'auto'.")

    def sample(self, state, model_args, model_kwargs):
        step = partial(sample_chain, self._target, self._kernels[1], self._num_warmup)
        return jax.vmap(step)(state) if self._vectorized else step(state)

    def postprocess_fn(self, model_args, model_kwargs):
        info, (args, kwargs) = self._info, self._args  # the data as traced at set-up (static where needed)

        def constrain(z):
            return info.constrain(z, args, kwargs)

        return constrain

    def get_diagnostics_str(self, state):
        return "{} steps of size {:.2e}. acc. prob={:.2f}".format(
            state.hmc.num_steps, state.hmc.adapt_state.step_size, state.hmc.mean_accept_prob)

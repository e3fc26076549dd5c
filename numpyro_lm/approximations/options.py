"""``LaplaceMatching``'s options as one immutable, checked object, and the fit they choose.

:func:`checked_options` refuses bad options when the object is made, naming the option and the
choices. :meth:`Options.fit` runs the approximation they ask for on one traced model: nested
Laplace (``hyper=``), the auto-pilot (:mod:`.autopilot`, the default) or the joint fit alone,
with the first curvature whose structure holds (:func:`~numpyro_lm.core.curvature_choice.curvature_candidates`),
the observed data's fault named where a fit fails on it, and the NUTS fallback where the
answer is not trusted (:mod:`.fallback`). :meth:`Options.fit_batch` fits a batch (``run_many``).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from ..checks.covariance import failure_cause
from ..checks.validation import check_count, check_settings
from ..core.curvature_choice import CURVATURES, StructureError, check_dense_memory, curvature_candidates
from ..core.starts import default_starts
from ..families import family_names, get_family
from ..families.bases import get_basis
from ..posterior.refine import REFINE_METHODS, check_refine_memory
from ..runtime.batch import batch_of, pad, pad_inputs
from ..runtime.distributed import is_multiprocess
from ..runtime.placement import check_device, fit_device, placed
from ..runtime.programs import on_device, resolve_compiler_options
from .across_processes import fit_across_processes
from .autopilot import run_auto
from .fallback import FALLBACKS, FallbackOptions, run_fallback
from .joint import run_joint
from .joint_fit import FitOptions
from .nested import run_nested

__all__ = ["Options", "checked_options"]


class Options(NamedTuple):
    """The options of :class:`~numpyro_lm.LaplaceMatching` (documented there), checked."""

    num_samples: int = 1000
    bases: Optional[dict] = None
    families: Optional[dict] = None
    init_strategy: Optional[Callable] = None
    method: str = "auto"
    tol: Optional[float] = None
    max_iter: int = 200
    regularize: Optional[float] = None
    newton_max_dim: int = 1000
    progress_bar: bool = True
    refine: Optional[str] = None
    hyper: object = None
    refine_num_samples: Optional[int] = None
    refine_max_iter: int = 200
    compiler_options: object = "auto"
    num_starts: Optional[int] = None
    strategy: str = "auto"
    fallback: Optional[str] = None
    curvature: str = "auto"
    plate: Optional[str] = None
    device: object = "auto"

    def fit_options(self, info, curvature: str) -> FitOptions:
        """The joint fit's options for a model and one curvature: Newton or an L-BFGS warm start
        (``method="auto"``: Newton up to ``newton_max_dim`` dense coordinates), the number of
        starts; a dense curvature that would not fit in memory is refused here."""
        if curvature != "dense":  # structured Newton steps cost O(D): no L-BFGS warm start needed
            method = "newton" if self.method == "auto" else self.method
        else:
            method = self.method if self.method != "auto" else ("newton" if info.size <= self.newton_max_dim
                                                                  else "lbfgs")
            why = {"dense": "curvature='dense' was asked for.",
                   "auto": "no structured curvature (block-arrowhead, low-rank update) holds for it."}[self.curvature]
            check_dense_memory(info.layout, jnp.dtype(jnp.result_type(float)).itemsize, why)
        return FitOptions(method, self.tol, self.max_iter, self.regularize, self.refine, self.refine_num_samples,
                          self.refine_max_iter, self.init_strategy, default_starts(info.size, self.num_starts),
                          curvature, self.plate, self.curvature == "auto")

    def fit(self, model, info, rng_key, args, kwargs, init_params=None):
        """The checked result these options ask for on one data set (module docstring)."""
        common = dict(num_samples=self.num_samples, progress_bar=self.progress_bar,
                      compiler_options=resolve_compiler_options(self.compiler_options, info.layout))
        # MVI refinement works in the dense eigenbasis: refused by the memory guards where it would not fit
        if self.refine is not None:
            check_refine_memory(info.layout, self.refine, self.refine_num_samples,
                                jnp.dtype(jnp.result_type(float)).itemsize)
        candidates = ["dense"] if self.refine is not None else curvature_candidates(info.layout, self.curvature,
                                                                                     self.plate)
        try:
            result = self._first_structure(info, candidates, rng_key, args, kwargs, init_params, common)
        except Exception as error:
            problem = failure_cause(info, args, kwargs)  # the data's fault, named where it is, or the prior's
            if problem is not None:
                raise problem from error
            raise
        if self.fallback is not None and not result.diagnostics()["trusted"]:
            fallback = FallbackOptions(model, self.bases, self.families, self.num_samples, self.progress_bar)
            result = run_fallback(fallback, result, rng_key, args, kwargs, self.fallback)
        return result

    def _first_structure(self, info, candidates, rng_key, args, kwargs, init_params, common):
        """The fit with the first curvature among ``candidates`` whose structure holds."""
        for i, curvature in enumerate(candidates):
            try:
                return self._approximation(info, self.fit_options(info, curvature), rng_key, args, kwargs,
                                           init_params, common)
            except StructureError:
                # the structure does not hold at the fit (a plate's entries that interact, a
                # likelihood of more than low rank): the next candidate, dense the last (where it
                # fits in memory, else check_dense_memory says so)
                if i == len(candidates) - 1:
                    raise

    def _approximation(self, info, options: FitOptions, rng_key, args, kwargs, init_params, common):
        """Nested, the auto-pilot's (its trail attached) or the joint fit."""
        if self.hyper is not None:
            return run_nested(info, options, self.hyper, rng_key, args, kwargs, init_params, **common)
        if self.strategy == "auto" and self.refine is None:
            result, trail = run_auto(info, options, rng_key, args, kwargs, init_params, **common)
            return result.with_trail(trail)
        return run_joint(info, options, rng_key, args, kwargs, init_params, **common)

    def fit_many(self, info, batch, rng_key, args, kwargs, init_params, compiler_options, on_failure: str,
                 gather: str, devices_given: bool):
        """``run_many``'s fit of a batch (unpadded arguments) on the devices :mod:`~numpyro_lm.runtime.placement`
        chooses (unless ``devices_given``), across every JAX process where there are several
        (:mod:`.across_processes`, ``gather``), else in this one (:meth:`fit_batch`)."""
        device = fit_device(self.device, (info.size + info.layout.observed_size) * batch.size)
        if not devices_given and device is not None:  # the chosen device's kind, all of this process's
            batch = batch_of(args, kwargs, batch.axes, [device] if isinstance(self.device, jax.Device)
                             else jax.local_devices(backend=device.platform))
        with placed(device):
            if is_multiprocess():
                return fit_across_processes(self, info, batch, rng_key, args, kwargs, init_params, compiler_options,
                                            on_failure, gather)
            args, kwargs = pad_inputs(*on_device(args, kwargs, device), batch)
            return self.fit_batch(info, batch, rng_key, args, kwargs,
                                  None if init_params is None else pad(init_params, batch), compiler_options,
                                  on_failure)

    def fit_batch(self, info, batch, rng_key, args, kwargs, init_params, compiler_options, on_failure: str):
        """The joint fit of a batch of data sets (arguments padded to ``batch``; ``run_many`` has
        refused nested fits already)."""
        if self.curvature == "lowrank":
            raise ValueError("curvature='lowrank' fits one data set at a time: call run() per data set, or pass "
                             "curvature='dense' or 'arrowhead' to run_many.")
        # a batch shares one program: the first curvature that does not need the model's prior per data set
        curvature = next(c for c in curvature_candidates(info.layout, self.curvature, self.plate) if c != "lowrank")
        return run_joint(info, self.fit_options(info, curvature), rng_key, args, kwargs, init_params,
                         num_samples=self.num_samples, compiler_options=compiler_options,
                         progress_bar=self.progress_bar, batch=batch, on_failure=on_failure)


def checked_options(**options) -> Options:
    """:class:`Options` from ``LaplaceMatching``'s keyword arguments, each refused where it is bad
    (naming the option and the choices), and combinations that cannot work."""
    o = Options(**options)
    check_settings(max_iter=o.max_iter, newton_max_dim=o.newton_max_dim, tol=o.tol, regularize=o.regularize,
                   progress_bar=o.progress_bar)
    if o.curvature not in CURVATURES:
        raise ValueError(f"curvature must be one of {CURVATURES}, not {o.curvature!r}")
    if o.refine is not None and o.curvature not in ("auto", "dense"):
        raise ValueError(f"refine={o.refine!r} works in the dense curvature's eigenbasis (D x D), not with "
                         f"curvature={o.curvature!r}: pass curvature='dense' (for models that fit in memory) or "
                         "leave refine out.")
    if o.method not in ("auto", "newton", "lbfgs"):
        raise ValueError(f"method must be 'auto', 'newton' or 'lbfgs', not {o.method!r}")
    check_count(o.num_samples, "num_samples")
    if o.refine is not None and o.refine not in REFINE_METHODS:
        raise ValueError(f"refine must be None or one of {REFINE_METHODS}, not {o.refine!r}")
    check_count(o.refine_num_samples, "refine_num_samples", allow_none=True)
    check_count(o.refine_max_iter, "refine_max_iter", minimum=0)
    hyper = o.hyper
    if hyper is not None and hyper != "auto" and not (
        isinstance(hyper, (list, tuple)) and hyper and all(isinstance(h, str) for h in hyper)
    ):
        raise ValueError(f'hyper must be None, "auto" or a list of site names, not {hyper!r}')
    if hyper is not None and o.refine is not None:
        raise ValueError("refine= and hyper= cannot be combined yet; choose one")
    for name in (o.bases or {}).values():
        get_basis(name)  # unknown names fail here, not deep inside a trace
    for name in (o.families or {}).values():
        if name not in family_names():
            get_family(name)  # raises with the list of families
    if o.strategy not in ("auto", "laplace"):
        raise ValueError(f'strategy must be "auto" or "laplace", not {o.strategy!r}')
    if o.fallback is not None and o.fallback not in FALLBACKS:
        raise ValueError(f'fallback must be None, "nuts" or "laplace_nuts", not {o.fallback!r}')
    check_count(o.num_starts, "num_starts", allow_none=True)
    check_device(o.device)
    return o._replace(bases=dict(o.bases or {}), families=dict(o.families or {}))

"""Argument checks of the public entry points: the argument, what is wrong, what to pass.

Everything here runs before any work, on the host, so that a bad argument fails with a
sentence instead of an ``AssertionError`` or a ``TypeError`` from deep inside JAX, and a
failed call leaves the object as it was.
"""

from __future__ import annotations

import inspect
import numbers

import jax
import numpy as np

__all__ = ["MCMC_ONLY_OPTIONS", "check_model", "check_rng_key", "check_count", "check_settings",
           "check_init_params", "refuse_mcmc_options"]

MCMC_ONLY_OPTIONS = {
    "num_warmup": "there is no warmup: the mode search and its curvature replace it",
    "num_chains": "the draws are independent (one 'chain'); several data sets at once go through run_many",
    "thinning": "the draws are independent: there is nothing to thin",
    "chain_method": "the draws are independent; several data sets at once go through run_many (devices=)",
    "jit_model_args": "array arguments are always traced (a refit with the same shapes reuses the programs); "
                      "arguments the model needs concretely are kept static by themselves",
    "postprocess_fn": "get_samples() returns the constrained values",
    "sampler": "the Laplace fit is the inference",
    "kernel": "the Laplace fit is the inference",
}
"""``numpyro.infer.MCMC`` options a user may carry over, and why LaplaceMatching has none."""


def refuse_mcmc_options(options: dict):
    """A ``TypeError`` for keyword arguments ``LaplaceMatching`` does not take, explaining the
    ones that come from ``MCMC``."""
    if not options:
        return
    name = sorted(options)[0]
    if name in MCMC_ONLY_OPTIONS:
        raise TypeError(f"LaplaceMatching takes no {name}= ({MCMC_ONLY_OPTIONS[name]}): drop it. "
                        "num_samples= and progress_bar= work as in MCMC.")
    raise TypeError(f"LaplaceMatching got an unexpected keyword argument {name!r}")


def check_model(model):
    """The model must be a callable NumPyro model: a function or an instance with ``__call__``."""
    if model is None or not callable(model):
        raise TypeError(f"model must be a NumPyro model (a function, or an object with __call__), not "
                        f"{type(model).__name__} {model!r:.60}")
    if inspect.isclass(model):
        raise TypeError(f"model is the class {model.__name__}, not a model: pass an instance "
                        f"(LaplaceMatching({model.__name__}(...))) whose __call__ is the model.")


def check_rng_key(rng_key, name: str = "rng_key"):
    """A JAX PRNG key: ``jax.random.PRNGKey(0)`` (uint32, shape (2,)) or ``jax.random.key(0)``."""
    dtype = getattr(rng_key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key) and np.shape(rng_key) == ():
        return
    if dtype is not None and np.dtype(dtype) == np.uint32 and np.shape(rng_key) == (2,):
        return
    raise TypeError(f"{name} must be one JAX PRNG key, e.g. jax.random.PRNGKey(0), not "
                    f"{type(rng_key).__name__} {rng_key!r:.60}" + (" (of shape " + str(np.shape(rng_key)) + ")"
                                                                 if dtype is not None else ""))


def check_count(value, name: str, minimum: int = 1, allow_none: bool = False):
    """An integer of at least ``minimum`` (``None`` where allowed)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, not {value}")


def check_settings(*, max_iter, newton_max_dim, tol, regularize, progress_bar):
    """``LaplaceMatching``'s numeric settings and its progress bar flag."""
    check_count(max_iter, "max_iter")
    check_count(newton_max_dim, "newton_max_dim", minimum=0)
    if tol is not None and not (isinstance(tol, numbers.Real) and tol > 0):
        raise ValueError(f"tol must be None or a positive number, not {tol!r}")
    if regularize is not None and not (isinstance(regularize, numbers.Real) and regularize >= 0):
        raise ValueError(f"regularize must be None or a non-negative number, not {regularize!r}")
    if not isinstance(progress_bar, (bool, np.bool_)):
        raise TypeError(f"progress_bar must be True or False, not {progress_bar!r}")


def check_init_params(init_params, layout):
    """``init_params``: ``{latent site: finite constrained value}``."""
    if init_params is None:
        return
    if not isinstance(init_params, dict):
        raise TypeError(f"init_params must be a dict {{site: constrained value}}, not {type(init_params).__name__}")
    names = [s.name for s in layout.sites]
    unknown = sorted(set(init_params) - set(names))
    if unknown:
        raise ValueError(f"init_params names {unknown}, which are not latent sites of the model; its latent sites "
                         f"are {names}.")
    for name, value in init_params.items():
        value = np.asarray(jax.device_get(value))
        if np.issubdtype(value.dtype, np.number) and not np.all(np.isfinite(value)):
            raise ValueError(f"init_params[{name!r}] is not finite: pass a value inside the site's support.")

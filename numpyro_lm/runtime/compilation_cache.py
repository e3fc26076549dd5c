"""JAX's persistent compilation cache, switched on for the library's programs: a second process starts warm.

A fit compiles a dozen programs (the mode search, the inner fits of nested Laplace, draws,
weights), seconds of XLA time that every new Python process pays again. JAX can keep compiled
programs on disk (``jax_compilation_cache_dir``); by default it keeps only those that took a
second or more to compile, which leaves out most of ours. :func:`use_compilation_cache`, called
by :meth:`numpyro_lm.LaplaceMatching.run`, points JAX at :func:`default_cache_dir` and keeps every
program that took :data:`MIN_COMPILE_SECONDS` or more, unless

- the user has set a cache directory of their own (``jax.config.update("jax_compilation_cache_dir",
  ...)`` or ``JAX_COMPILATION_CACHE_DIR``): theirs is used as they configured it;
- the environment variable :data:`ENV` is ``0`` / ``off`` / ``false`` (or names another directory);
- the user switched JAX's cache off (``jax_enable_compilation_cache=False``).

The cache is JAX's own (keyed by the program, its shapes, the XLA options and the jaxlib
version); it is process-wide, so the user's own programs compiled afterwards are cached too.
``enable=False`` (:func:`use_compilation_cache`) leaves JAX as it is. JAX's documentation:
https://docs.jax.dev/en/latest/persistent_compilation_cache.html
"""

from __future__ import annotations

import os
from typing import Optional

import jax

__all__ = ["ENV", "MIN_COMPILE_SECONDS", "default_cache_dir", "use_compilation_cache"]

ENV = "NUMPYRO_LM_COMPILATION_CACHE"
MIN_COMPILE_SECONDS = 0.1
"""Programs that took at least this long to compile are kept (JAX's default is 1 s: most of a
fit's programs compile in 0.1-1 s); quicker ones cost less to compile again than to read."""

_OFF = {"0", "off", "false", "no"}
_state = {"ours": None, "choice": None}  # the directory this module set; the user's enable= (None: not given)


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/numpyro_lm/jax`` (``~/.cache/numpyro_lm/jax`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "numpyro_lm", "jax")


def use_compilation_cache(enable: Optional[bool] = None) -> Optional[str]:
    """Switch JAX's persistent compilation cache on at :func:`default_cache_dir` (or the
    directory :data:`ENV` names) unless the user configured one or switched it off (module
    docstring). Returns the directory in use (the user's own included), or ``None``.

    :param enable: ``False`` switches the library's cache off for this process (and takes back
        the directory it set), ``True`` on again; ``None`` (every fit's call) keeps the last choice.
    """
    if enable is not None:
        _state["choice"] = bool(enable)
    current = jax.config.jax_compilation_cache_dir
    if current and current != _state["ours"]:
        return current  # the user's own
    setting = os.environ.get(ENV, "").strip()
    if _state["choice"] is False or setting.lower() in _OFF or not jax.config.jax_enable_compilation_cache:
        if current and current == _state["ours"]:
            jax.config.update("jax_compilation_cache_dir", None)
            _state["ours"] = None
        return None
    path = setting or default_cache_dir()
    if current == path:
        return path
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:  # a read-only home: no cache, as before
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    if jax.config.jax_persistent_cache_min_compile_time_secs > MIN_COMPILE_SECONDS:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    _state["ours"] = path
    return path

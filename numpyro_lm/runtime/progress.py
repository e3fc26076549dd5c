"""Progress bars that stay out of the way: shown only after two seconds, and never written to
a file or pipe (a log gets no carriage-return spam); notebooks get tqdm's widget.

``progress_bar=True`` (the default of :class:`~numpyro_lm.LaplaceMatching`, as in
``numpyro.infer.MCMC``) asks for a bar; this module decides whether one can be seen.
"""

from __future__ import annotations

import sys

from tqdm.auto import tqdm

__all__ = ["progress", "DELAY_SECONDS"]

DELAY_SECONDS = 2.0
"""A bar appears only once the work has run this long."""


def _visible(stream) -> bool:
    if any(c.__module__ == "tqdm.notebook" for c in tqdm.__mro__):  # tqdm.auto chose the widget
        return True
    return bool(getattr(stream, "isatty", lambda: False)())


def progress(enabled: bool, **kwargs) -> tqdm:
    """A ``tqdm`` bar (``kwargs`` as tqdm's), disabled unless ``enabled`` and a terminal (or
    a notebook) shows it, and delayed by :data:`DELAY_SECONDS`."""
    return tqdm(disable=not (enabled and _visible(sys.stderr)), delay=DELAY_SECONDS, **kwargs)

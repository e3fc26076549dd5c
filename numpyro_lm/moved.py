"""Where the modules of the flat layout (before the pipeline's folders) went: the old import paths
keep working, with a ``FutureWarning`` that names the new place.

``import numpyro_lm.bridge`` gives :mod:`numpyro_lm.contrib.bridge` itself (the same module
object); an old module whose names now live in several modules (``numpyro_lm.optimize``: Newton,
its derivatives, its steps, L-BFGS) gives a module that finds each name where it went. The old
``numpyro_lm.laplace`` module cannot come back: ``numpyro_lm.laplace`` is the function.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

__all__ = ["OLD_MODULES", "install"]

_STAGES = {
    "runtime": ["programs", "static_data", "progress", "batch", "random"],
    "curvature": ["linalg"],
    "mode": ["hessian"],
    "families": ["bases", "quantiles"],
    "core": ["model", "structure", "curvature_choice"],
    "marginal": ["laplace_marginal"],
    "posterior": ["refine", "copula"],
    "checks": ["verdict", "boundary", "errors", "validation"],
    "samplers": ["laplace_nuts"],
    "approximations": ["result", "joint", "autopilot", "fallback", "nested.mixture", "nested.search"],
    "contrib": ["bridge", "gp", "nn", "networks"],
}
_SUBMODULES = {"gp": ["blocks", "component", "loo", "model", "pseudo", "refine", "regression"],
               "nn": ["last_layer", "metrics", "model", "predictive"],
               "networks": ["fit", "generate", "metrics", "model", "mtcov"]}

OLD_MODULES = {f"numpyro_lm.{old}": (f"numpyro_lm.{stage}.{old}",) for stage, olds in _STAGES.items() for old in olds}
OLD_MODULES.update({f"numpyro_lm.{app}.{sub}": (f"numpyro_lm.contrib.{app}.{sub}",)
                    for app, subs in _SUBMODULES.items() for sub in subs})
OLD_MODULES.update({
    "numpyro_lm.xla_runtime": ("numpyro_lm.runtime.xla_flags",),
    "numpyro_lm.optimize": ("numpyro_lm.mode.newton", "numpyro_lm.mode.derivatives", "numpyro_lm.mode.steps",
                            "numpyro_lm.mode.lbfgs"),
    "numpyro_lm.trace": ("numpyro_lm.core.trace", "numpyro_lm.mode.derivatives"),
    "numpyro_lm.marginals": ("numpyro_lm.posterior.marginals", "numpyro_lm.core.trace"),
    "numpyro_lm.diagnostics": ("numpyro_lm.checks.psis",),
    "numpyro_lm.data_checks": ("numpyro_lm.checks.data",),
    "numpyro_lm.fit": ("numpyro_lm.approximations.joint_fit", "numpyro_lm.core.starts"),
    "numpyro_lm.nested": ("numpyro_lm.approximations.nested", "numpyro_lm.core.structure",
                          "numpyro_lm.marginal.conditional", "numpyro_lm.core.trace"),
    "numpyro_lm.nested.fit": ("numpyro_lm.approximations.nested.fit",),  # hyper_sites: imported there
    "numpyro_lm.nested.design": ("numpyro_lm.approximations.nested.design",),  # MAX_CCD_DIM: imported there
    "numpyro_lm.nested.inner": ("numpyro_lm.marginal.conditional",),
    "numpyro_lm.nested.quadrature": ("numpyro_lm.marginal.quadrature",),
    "numpyro_lm.adapters": ("numpyro_lm.samplers",),
    "numpyro_lm.adapters.nuts": ("numpyro_lm.samplers.warm_nuts",),
    "numpyro_lm.adapters.elliptical_slice": ("numpyro_lm.samplers.elliptical_slice",),
    "numpyro_lm.families.base": ("numpyro_lm.families.registry",),
})
"""``{old module: (new modules, the first the main one)}``."""

_REFUSED = {"numpyro_lm.laplace": "numpyro_lm.mode.laplace_state"}


class _SplitModule(types.ModuleType):
    """An old module whose names went to several new ones: each name is looked up in turn. (Only
    where the old module's parent is not a new module: the import system sets an old submodule as
    an attribute of its parent.)"""

    def __init__(self, name: str, targets: tuple):
        super().__init__(name, f"Moved: its names are in {', '.join(targets)}.")
        self._targets = targets
        self.__path__ = []  # a package still: its old submodules resolve through the finder

    def __getattr__(self, attr):
        for target in self._targets:
            module = importlib.import_module(target)
            if hasattr(module, attr):
                return getattr(module, attr)
        raise AttributeError(f"{self.__name__} moved to {' and '.join(self._targets)}, none of which has {attr!r}")


class _OldPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves an old module path with the module (or names) it moved to."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in _REFUSED:
            raise ModuleNotFoundError(f"{fullname} moved to {_REFUSED[fullname]} ({fullname} is the function "
                                      f"laplace now): from {_REFUSED[fullname]} import ...", name=fullname)
        if fullname in OLD_MODULES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        targets = OLD_MODULES[spec.name]
        warnings.warn(f"{spec.name} moved to {' and '.join(targets)}: import from there (the old path goes away "
                      "in a later release)", FutureWarning, stacklevel=2)
        if len(targets) == 1:
            return importlib.import_module(targets[0])
        return _SplitModule(spec.name, targets)

    def exec_module(self, module):
        pass  # already imported


def install():
    """Put the finder first on ``sys.meta_path`` (once): before the path finder would look for an
    old submodule inside the new package an old parent path resolved to."""
    if not any(isinstance(f, _OldPathFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _OldPathFinder())

"""The latent sites of a NumPyro model and their place in one flat vector of LM-basis coordinates.

``trace_sites`` runs the model once (abstractly, under ``jax.eval_shape``) and returns a
:class:`SiteSpec` per latent site: shapes, support, basis, matched family, prior, and
where the site's coordinates sit in the flat vector. It refuses what a Laplace
approximation cannot treat, naming the site.

``basis_value`` is the ``substitute_fn`` that runs the model with every latent site taken
from basis coordinates (:class:`numpyro_lm.core.model.ModelInfo` builds on it). The basis
transform of a site is rebuilt from the support seen *in that run*, so a support that
depends on another site (``Uniform(0, 1 - a)``) is always mapped with the current value
of ``a``; NumPyro's own ``_unconstrain_reparam`` works the same way, and the
log-Jacobian enters as a factor scaled like the site.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.distributions import MaskedDistribution, constraints
from numpyro.distributions.util import sum_rightmost

from ..families import MatchedFamily, family_for_prior, get_family
from ..families.bases import Basis, basis_for_prior, get_basis
from ..mode.derivatives import Pieces
from ..runtime.programs import is_traced

__all__ = ["SiteSpec", "Layout", "SiteChoice", "trace_sites", "missing_data_sites", "site_transform", "basis_value",
           "is_elementwise", "JOINT_EVENT_MAX", "observed_site_names", "split_coordinates", "unravel", "ravel",
           "site_values", "site_runs"]


class SiteSpec(NamedTuple):
    """What LM needs to know about one latent sample site."""

    name: str
    shape: tuple  # constrained value shape (batch + event)
    basis_shape: tuple  # shape of the site's basis coordinates
    basis_event_dim: int  # event dims of the basis coordinates
    basis: str
    family: str
    prior: str  # class name of the prior distribution
    offset: int  # first index of the site in the flat vector
    size: int
    plates: tuple = ()  # names of the plates the site sits in
    plate_dims: tuple = ()  # (name, dim, size) of each of those plates

    @property
    def batch_ndim(self) -> int:
        """Leading (batch) dims of the basis coordinates."""
        return len(self.basis_shape) - self.basis_event_dim


class Layout(NamedTuple):
    """The latent sites of a model in trace order, and the length of the flat vector."""

    sites: tuple
    size: int
    observed_size: int = 0  # numbers in the observed sites' values (a memory estimate's input)
    missing_data: tuple = ()  # the latent "{y}_unobserved" sites of obs_mask (missing_data_sites)

    def site(self, name: str) -> SiteSpec:
        for s in self.sites:
            if s.name == name:
                return s
        raise KeyError(name)

    def coordinate(self, index: int) -> str:
        """A readable name for flat coordinate ``index``: ``"tau"`` or ``"theta[3]"``."""
        for s in self.sites:
            if s.offset <= index < s.offset + s.size:
                if s.size == 1:
                    return s.name
                where = tuple(int(i) for i in jnp.unravel_index(index - s.offset, s.basis_shape))
                return f"{s.name}[{', '.join(map(str, where))}]"
        raise IndexError(index)


JOINT_EVENT_MAX = 2000
"""Most coordinates of a real event vector (a ``GaussianRandomWalk``'s path, a
``MultivariateNormal``'s value) whose matched family is its joint Gaussian. A longer one is
matched coordinate by coordinate, ``Normal(loc, scale).to_event(1)``: its covariance is dense
(``size^2`` numbers: 400 MB at 10^4 steps), where the fit's curvature over a Markov field is a
band; its correlations live in the draws (``get_samples``)."""


def is_elementwise(site: SiteSpec, family: MatchedFamily) -> bool:
    """Whether the site is matched one coordinate at a time (Gamma, Beta, Normal over a scalar
    site, or over a real event vector longer than :data:`JOINT_EVENT_MAX`), not per event vector
    (Dirichlet, MultivariateNormal)."""
    if family.event_dim is not None:
        return family.event_dim == 0
    if family.name == "normal" and site.size > JOINT_EVENT_MAX:
        return True
    return site.basis_event_dim != 1


def observed_site_names(trace) -> list:
    """Observed sample sites of a numpyro trace, without ``numpyro.factor`` terms (``Unit`` distributions)."""
    return [
        n for n, s in trace.items()
        if s["type"] == "sample" and s["is_observed"] and not isinstance(s["fn"], dist.Unit)
    ]


def split_coordinates(layout, marginalize) -> tuple:
    """``(theta_index, phi_index)``: the flat coordinates of the sites named in ``marginalize``
    and of the rest, each in the layout's order (LaplaceNUTS's field and hyperparameters, a nested
    fit's hyperparameters and conditional coordinates)."""
    theta = [s for s in layout.sites if s.name in marginalize]
    phi = [s for s in layout.sites if s.name not in marginalize]
    index = lambda sites: np.concatenate([np.arange(s.offset, s.offset + s.size) for s in sites]) if sites else \
        np.zeros(0, int)
    return index(theta), index(phi)


def unravel(layout: Layout, flat):
    """Flat vector ``(..., D)`` (or its :class:`Pieces`) -> ``{site: basis coordinates}``
    (leading dims kept)."""
    if isinstance(flat, Pieces):
        lead = flat.arrays[0].shape[:-1]
        return {s.name: flat.site(s.offset, s.size).reshape(lead + s.basis_shape) for s in layout.sites}
    lead = flat.shape[:-1]
    return {
        s.name: flat[..., s.offset : s.offset + s.size].reshape(lead + s.basis_shape)
        for s in layout.sites
    }


def ravel(layout: Layout, values) -> jnp.ndarray:
    """Inverse of :func:`unravel` for unbatched values."""
    return jnp.concatenate([jnp.reshape(values[s.name], (-1,)) for s in layout.sites])


def site_values(layout, theta_index, theta, x) -> dict:
    """``{site: basis coordinates}`` with the sites at ``theta_index`` from ``theta`` and the
    others from ``x`` (each in layout order). Not one flat vector: differentiation in ``x``
    then carries no tangent through what only ``theta``'s sites compute (a kernel matrix and
    its Cholesky factor)."""
    hyper = set(int(i) for i in theta_index)
    out, at = {}, {True: 0, False: 0}
    for site in layout.sites:
        is_hyper = site.offset in hyper
        source, start = (theta if is_hyper else x), at[is_hyper]
        out[site.name] = source[start : start + site.size].reshape(site.basis_shape)
        at[is_hyper] += site.size
    return out


def site_runs(layout: Layout, large: int = 16, most: int = 8) -> tuple:
    """``((start, stop), ...)``: the flat coordinates in runs for a Hessian by blocks
    (:func:`numpyro_lm.mode.derivatives.value_grad_hessian`): each site of at least ``large``
    coordinates alone, the small sites between them together. ``()`` where that gives one run
    or more than ``most`` (one derivative program per run: compile time)."""
    runs = []
    for s in layout.sites:
        if runs and s.size < large and not runs[-1][2]:
            runs[-1][1] = s.offset + s.size
        else:
            runs.append([s.offset, s.offset + s.size, s.size >= large])
    if len(runs) < 2 or len(runs) > most:
        return ()
    return tuple((a, b) for a, b, _ in runs)


def _is_latent(site) -> bool:
    return site["type"] == "sample" and not site["is_observed"]


class SiteChoice(NamedTuple):
    """The user's per-site overrides (``{site: basis name}``, ``{site: family name}``),
    kept as sorted pairs so that a choice is hashable (it keys compiled programs)."""

    bases: tuple = ()
    families: tuple = ()

    @classmethod
    def of(cls, bases=None, families=None) -> "SiteChoice":
        return cls(tuple(sorted(dict(bases or {}).items())), tuple(sorted(dict(families or {}).items())))

    def basis(self, site) -> Basis:
        name = site["name"]
        chosen = dict(self.bases).get(name)
        if chosen is not None:
            return get_basis(chosen)
        return basis_for_prior(site["fn"])

    def family(self, site, basis: Basis) -> MatchedFamily:
        """The user's family, else the one registered for the prior, else the basis default."""
        name = site["name"]
        chosen = dict(self.families).get(name)
        if chosen is None:
            prior = type(site["fn"]).__name__
            chosen = family_for_prior(prior, basis.name) or basis.family
        try:
            return get_family(chosen, basis.name)
        except ValueError as e:
            raise ValueError(
                f"site {name!r}: {e} The site uses the {basis.name!r} basis: pass "
                f"bases={{{name!r}: ...}} with one of those, or choose another family."
            ) from None


def site_transform(choice: SiteChoice, site):
    basis = choice.basis(site)
    try:
        return basis.transform_for(site["fn"])
    except (NotImplementedError, ValueError) as e:
        raise ValueError(
            f"site {site['name']!r}: no {basis.name!r} basis for its support "
            f"{site['fn'].support}. Choose another basis with bases={{{site['name']!r}: ...}} "
            f"or register one with numpyro_lm.register_basis. ({e})"
        ) from e


def basis_value(params, choice: SiteChoice, site):
    """substitute_fn: basis coordinates -> constrained value, adding log|det J| as a factor."""
    name = site["name"]
    if name not in params or not _is_latent(site):
        return None
    y = params[name]
    t = site_transform(choice, site)
    x = t(y)
    log_det = t.log_abs_det_jacobian(y, x)
    log_det = sum_rightmost(log_det, jnp.ndim(log_det) - jnp.ndim(x) + len(site["fn"].event_shape))
    if jnp.ndim(x) > len(site["kwargs"].get("sample_shape", ()) + site["fn"].shape()):
        # a site inside numpyro's scan: each step takes its row of the whole series (x), and
        # each step's factor counts once; each step gets the series' log-Jacobian over its
        # length (the whole series' at every step counted it length times, and stacked an
        # (n, n) array of factors)
        log_det = jnp.sum(log_det, axis=0) / jnp.shape(x)[0]
    if site["scale"] is not None:
        log_det = site["scale"] * log_det
    numpyro.factor(f"_{name}_lm_log_det", log_det)
    return x


def missing_data_sites(trace) -> tuple:
    """The latent sites ``"{y}_unobserved"`` that ``numpyro.sample("y", ..., obs_mask=mask)``
    creates beside an observed ``"{y}_observed"`` and a deterministic ``"{y}"``.

    The site is masked by ``~mask``: its entries at the observed positions have no density
    and reach nothing (``y`` takes the data there), so they would be flat directions of the
    posterior (NUTS lets them drift). :meth:`numpyro_lm.core.model.ModelInfo.log_density` gives
    them a standard normal density in the basis instead: a factor of one, independent of
    everything else, so every other marginal is unchanged and the Laplace fit is proper.
    """
    names = []
    for name, site in trace.items():
        base = name[: -len("_unobserved")]
        observed, value = trace.get(f"{base}_observed"), trace.get(base)
        if (name.endswith("_unobserved") and _is_latent(site) and isinstance(site["fn"], MaskedDistribution)
                and observed is not None and observed["type"] == "sample" and observed["is_observed"]
                and value is not None and value["type"] == "deterministic"):
            names.append(name)
    return tuple(names)


def _refuse(site, why: str, fix: str):
    raise ValueError(f"site {site['name']!r}: {why}. {fix}")


def _check_full_data(site, subsampled_plates):
    frames = {f.name for f in site["cond_indep_stack"]}
    if frames & subsampled_plates:
        _refuse(
            site,
            f"it lies in the subsampled plate(s) {sorted(frames & subsampled_plates)}",
            "Laplace Matching needs the full data; drop subsample_size from the plate.",
        )


def _check_latent_site(site, subsampled_plates):
    fn = site["fn"]
    if fn.support.is_discrete or fn.is_discrete:
        _refuse(
            site,
            f"discrete latent variables ({type(fn).__name__}) have no Laplace approximation",
            "Marginalise it out in the model (sum over its values with logsumexp and "
            "numpyro.factor) or sample it with MCMC (for example DiscreteHMCGibbs).",
        )
    if site["infer"].get("enumerate"):
        _refuse(site, "enumerated sites are not supported", "Marginalise it out in the model.")
    if fn.support is constraints.circular:
        # an interval basis cuts the circle at +-pi: a posterior across the cut would be split in two
        _refuse(site, f"its support is circular ({type(fn).__name__}) and no Gaussian basis covers a circle",
                "Reparameterise it onto the real line: numpyro.handlers.reparam(model, "
                f"config={{{site['name']!r}: numpyro.infer.reparam.CircularReparam()}}).")
    if isinstance(fn.support, constraints._Simplex) and fn.event_shape[-1:] == (1,):
        _refuse(site, "it is a simplex of one category, always [1.]: there is nothing to infer",
                "Replace it by jnp.ones(1) (or give it two categories or more).")
    _check_full_data(site, subsampled_plates)


def trace_sites(model, args, kwargs, choice: SiteChoice, init_strategy, rng_key) -> Layout:
    """Run the model abstractly and describe its latent sites (see :class:`SiteSpec`)."""
    found, observed, missing = [], [], []
    # only array arguments are traced: Python numbers stay concrete (plate sizes)
    leaves, treedef = jax.tree.flatten((args, kwargs))
    is_array = [is_traced(leaf) for leaf in leaves]

    def run(rng_key, arrays):
        arrays = iter(arrays)
        args, kwargs = jax.tree.unflatten(treedef, [next(arrays) if a else x for x, a in zip(leaves, is_array)])
        seeded = handlers.substitute(handlers.seed(model, rng_key), substitute_fn=init_strategy)
        tr = handlers.trace(seeded).get_trace(*args, **kwargs)
        subsampled = {
            name
            for name, site in tr.items()
            if site["type"] == "plate" and site["args"][1] is not None and site["args"][1] != site["args"][0]
        }
        out = {}
        for name, site in tr.items():
            if site["type"] == "sample" and site["is_observed"]:
                _check_full_data(site, subsampled)
            if not _is_latent(site):
                continue
            _check_latent_site(site, subsampled)
            basis = choice.basis(site)
            family = choice.family(site, basis)
            t = site_transform(choice, site)
            y = t.inv(site["value"])
            found.append((name, tuple(jnp.shape(site["value"])), basis.name, family.name,
                          type(site["fn"]).__name__, t.domain.event_dim,
                          tuple(f.name for f in site["cond_indep_stack"]),
                          tuple((f.name, f.dim, f.size) for f in site["cond_indep_stack"])))
            out[name] = y
        observed.append(sum(int(np.prod(jnp.shape(site["value"]))) for site in tr.values()
                            if site["type"] == "sample" and site["is_observed"]))
        missing.append(missing_data_sites(tr))
        return out

    shapes = jax.eval_shape(run, rng_key, [x for x, a in zip(leaves, is_array) if a])
    unknown = ({n for n, _ in choice.bases} | {n for n, _ in choice.families}) - set(shapes)
    if unknown:
        raise ValueError(
            f"bases/families name {sorted(unknown)}, which are not latent sample sites of the "
            f"model; its latent sites are {[f[0] for f in found]}."
        )
    sites, offset = [], 0
    for name, shape, basis, family, prior, event_dim, plates, plate_dims in found:
        basis_shape = tuple(shapes[name].shape)
        size = math.prod(basis_shape)
        sites.append(SiteSpec(name, shape, basis_shape, event_dim, basis, family, prior, offset, size, plates,
                              plate_dims))
        offset += size
    if not sites:
        raise ValueError("the model has no latent sample sites: there is nothing to infer.")
    return Layout(tuple(sites), offset, observed[0] if observed else 0, missing[0] if missing else ())

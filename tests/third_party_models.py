"""Models written by others: the robustness corpus of issue 17.

Small NumPyro models written the way third-party users write them, each imitating one of
NumPyro's own examples, tests or notebooks (cited in a comment above the model). They
exercise what a Laplace library meets in the wild rather than what its own tests construct:
plate sizes computed in Python from data arguments (`int(n)`, `np.max`, `np.unique`),
closures over global data, callable objects, handler-wrapped models, `numpyro.factor`
targets, circular and spherical supports, missing data through `obs_mask`, zero-size and
zero-dimensional sites, discrete latents, `numpyro.param` sites, subsampling, `scan` and ODEs.
A second batch adds the rest of the examples' repertoire: ordered, zero-sum, Pareto and
dependent-interval supports, `handlers.scale` weights, `scope`d site names, plates at dims
-3 to -1, hand-marginalised likelihoods, truncation and censoring, and `jnp.where` on latents.

Every case is small (a few to ~200 latent numbers, at most a few hundred data points) and its
data come from numpy with a fixed seed. Data are numpy arrays, as users pass them.
`case(name)` returns a `Case`; `CASES` maps every name to its case.
"""

from functools import cache

from third_party_classics import CLASSICS
from third_party_common import Case
from third_party_examples import EXAMPLES

__all__ = ["CASES", "NAMES", "Case", "case"]

_BUILDERS = {**CLASSICS, **EXAMPLES}
NAMES = tuple(_BUILDERS)


@cache
def case(name) -> Case:
    return _BUILDERS[name]()


CASES: dict[str, Case] = {name: case(name) for name in NAMES}

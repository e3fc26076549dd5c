"""The seeds' distance claim (thesis 3.5.6): Laplace is closer to the truth in the LM basis.

Runs the experiment of ``benchmarks/distances.py`` (which writes ``docs/distances.md``) on
the first parameter set of each family (and the last of two) of Table A.1 with fewer draws.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import distances  # noqa: E402

pytestmark = pytest.mark.usefixtures("x64")

# every family at the first set (small parameters, where the seeds' point is sharpest);
# the last set for two families (near-Gaussian: the gap is smallest there)
# (make test runs Chi2's first set; CI=true and make test-all every case)
CASES = [
    pytest.param(family, i, params[i], bases, id=f"{family}-{i + 1}",
                 marks=pytest.mark.slow)
    for family, params, bases in distances.experiments()
    for i in ((0, 9) if family in ("Gamma", "Beta") else (0,))
]


@pytest.mark.parametrize("family,i,d,bases", CASES)
def test_lm_basis_is_closer_than_the_standard_basis(family, i, d, bases):
    results = {name: distances.distances(d, t, num_kl=4000, num_mmd=300, seed=i) for name, t in bases.items()}
    lm = {name: r for name, r in results.items() if name != "standard"}
    # the default LM basis (log, logit, softmax) always has a Laplace approximation, also
    # for the small parameters where the standard basis has none (the seeds' point); the
    # sqrt basis has none for Gamma-type shapes <= 1/2
    default = next(iter(lm))
    assert lm[default] is not None
    lm = {name: r for name, r in lm.items() if r is not None}
    best = min(r[0] for r in lm.values())
    standard = results["standard"]
    if standard is not None:
        # margin: 3 standard errors of the LM estimate (4000 draws). The standard-basis
        # estimate is noisier where p has heavy tails (InverseGamma(1, .): SE ~ 40 %), but
        # those tails only make its true KL larger
        se = min(r[1] for r in lm.values())
        assert best + 3 * se < standard[0]

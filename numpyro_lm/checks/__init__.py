"""Whether an answer can be trusted, and what is wrong where it cannot: PSIS (:mod:`.psis`),
the verdict (:mod:`.verdict`) and the marginals' shifts it weighs (:mod:`.shift`), the boundary of a scale's support (:mod:`.boundary`), errors
that name the site, the cause and the fix (:mod:`.errors`), argument checks
(:mod:`.validation`) and the observed data's (:mod:`.data`).

Imports the stages below it: runtime, curvature, mode, families, core, marginal, posterior.
"""

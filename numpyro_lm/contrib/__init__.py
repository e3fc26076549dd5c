"""The seed applications, beside the core (``numpyro.contrib`` style): the Laplace Bridge for
classifier logits (:mod:`.bridge`), LM + GP (:mod:`.gp`), the Laplace Bridge for networks
(:mod:`.nn`) and PIHAM memberships of attributed multilayer networks (:mod:`.networks`).

They import the core stages; the core imports nothing from them.
"""

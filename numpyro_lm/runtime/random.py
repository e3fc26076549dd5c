"""Random draws from JAX keys, reproducible and stable in the number of draws.

The same key gives the same draws, under ``jax.jit`` and ``jax.vmap`` alike, and asking
for more draws extends the first ones instead of replacing them (:func:`_rows`). Gamma variates (for the Dirichlet and Wishart
families) come from NumPy's sampler on the host, seeded by the key (a ``pure_callback``
that vmaps): no rejection sampler to compile.

The NumPy helpers at the end serve host-side work (nested Laplace's mixture draws,
importance resampling), seeded from a concrete key.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["standard_normal", "normal_rows", "uniform_rows", "log_gamma", "host_generator", "host_log_gamma",
           "num_pseudo_chains", "split_chains", "PSEUDO_CHAINS"]


# M. Giles, "Approximating the erfinv function" (GPU Computing Gems, 2010), single precision:
# erfinv(x) = x p(w), w = -log((1 - x)(1 + x)), p a polynomial in w - 2.5 (w < 5) or in sqrt(w) - 3
_ERFINV_CENTRE = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                  -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                0.00943887047, 1.00167406, 2.83297682)


def _polynomial(coefficients, t):
    p = jnp.full_like(t, coefficients[0])
    for c in coefficients[1:]:
        p = p * t + c
    return p


def _erfinv32(x):
    """Giles's single-precision ``erfinv`` (relative error below 1e-6 against SciPy's float64 one)."""
    w = -jnp.log((1.0 - x) * (1.0 + x))
    centre = _polynomial(_ERFINV_CENTRE, w - 2.5)
    tail = _polynomial(_ERFINV_TAIL, jnp.sqrt(jnp.maximum(w, 5.0)) - 3.0)
    return jnp.where(w < 5.0, centre, tail) * x


def standard_normal(rng_key, shape: tuple, dtype=None):
    r"""Standard normal draws of ``shape``: in float32, :math:`\sqrt2\,\mathrm{erfinv}(u)` of 24-bit
    uniforms :math:`u` on :math:`(-1, 1)` (``|z| <= 5.42``; the tails beyond hold 6e-8 of the
    mass) with Giles's single-precision ``erfinv``; in float64, ``jax.random.normal``.

    Why not ``jax.random.normal`` in float32: XLA's ``erf_inv`` goes through ``log1p``, which its
    CPU backend does not vectorise: 10^8 normals in rows of 10^5 took 2.3 s on 2 cores, 0.76 s
    here, of which 0.65 s are the random bits themselves (issue 42: the draws of a 10^5-coordinate
    field). Reproducible from the key, under ``jit`` and ``vmap``, as JAX's own.
    """
    dtype = jnp.result_type(float) if dtype is None else jnp.dtype(dtype)
    if dtype != jnp.float32:
        return jax.random.normal(rng_key, shape, dtype)
    bits = jax.random.bits(rng_key, shape, jnp.uint32)
    # the top 24 bits k, centred: (2k + 1 - 2^24) 2^-24, an odd integer below 2^24 over 2^24: exact
    # in float32 (k + 1/2 is not, above 2^23: it rounded to u = 1 and an infinite draw), never +-1
    odd = (2 * (bits >> 8) + 1).astype(jnp.int32) - 2**24
    u = odd.astype(jnp.float32) * (2.0**-24)
    return (np.sqrt(2.0) * _erfinv32(u)).astype(dtype)


def _rows(draw, rng_key, num_rows: int, shape: tuple):
    """``draw(key, shape)`` for ``(num_rows,) + shape``, row ``i`` independent of ``num_rows``.

    JAX's partitionable Threefry (its default) already generates each element from its
    index alone, so one call is stable in ``num_rows``; otherwise row ``i`` is drawn from
    ``fold_in(rng_key, i)`` (slower to compile).
    """
    if jax.config.jax_threefry_partitionable:
        return draw(rng_key, (num_rows,) + shape)
    return jax.vmap(lambda i: draw(jax.random.fold_in(rng_key, i), shape))(jnp.arange(num_rows))


def normal_rows(rng_key, num_rows: int, shape: tuple = (), dtype=None):
    """``(num_rows,) + shape`` standard normal draws; the first rows do not depend on ``num_rows``."""
    dtype = jnp.result_type(float) if dtype is None else dtype
    return _rows(lambda k, s: standard_normal(k, s, dtype), rng_key, num_rows, tuple(shape))


def uniform_rows(rng_key, num_rows: int, shape: tuple = (), dtype=None):
    """``(num_rows,) + shape`` uniforms on ``(0, 1)`` (never exactly 0), stable as above."""
    dtype = jnp.result_type(float) if dtype is None else dtype
    tiny = jnp.finfo(dtype).tiny
    return _rows(lambda k, s: jax.random.uniform(k, s, dtype, minval=tiny), rng_key, num_rows, tuple(shape))


def _key_bits(rng_key):
    if jnp.issubdtype(rng_key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(rng_key)
    return rng_key


def log_gamma(rng_key, concentration, num_rows: int):
    r"""``log X``, ``X ~ Gamma(concentration, 1)``: ``(num_rows,) + concentration.shape`` draws.

    NumPy's Gamma sampler on the host, seeded by the key's bits (JAX's own compiles a
    rejection loop for half a second; inverting the CDF costs a microsecond a draw), with
    :math:`X = Y U^{1/\alpha}`, ``Y ~ Gamma(alpha + 1)``, so the log stays finite for
    concentrations far below one. Reproducible from the key, stable in ``num_rows`` (the
    host fills the draws in order), and under ``jax.vmap`` one call per key.
    """
    concentration = jnp.asarray(concentration)
    dtype = jnp.result_type(concentration, float)
    shape = (num_rows,) + concentration.shape

    def host(bits, alpha):
        seed = [int(b) for b in np.asarray(bits, np.uint32).ravel()]
        alpha = np.broadcast_to(np.asarray(alpha, np.float64), shape)
        y = np.random.default_rng(seed + [0]).standard_gamma(alpha + 1.0)
        u = np.random.default_rng(seed + [1]).random(shape)
        return (np.log(y) + np.log(u) / alpha).astype(dtype)

    bits = _key_bits(rng_key)
    if not any(isinstance(a, jax.core.Tracer) for a in (bits, concentration)):
        return jnp.asarray(host(bits, concentration))  # eager: no callback (quantiles._on_host says why)
    return jax.pure_callback(host, jax.ShapeDtypeStruct(shape, dtype), bits, concentration, vmap_method="sequential")


def host_generator(rng_key, stream: int = 0) -> np.random.Generator:
    """A NumPy generator seeded by a concrete JAX key and a stream number (host-side work)."""
    if jnp.issubdtype(rng_key.dtype, jax.dtypes.prng_key):
        rng_key = jax.random.key_data(rng_key)
    bits = np.asarray(rng_key, np.uint32).ravel()  # on the host: no eager program
    return np.random.default_rng([int(b) for b in bits] + [stream])


def host_log_gamma(rng: np.random.Generator, concentration) -> np.ndarray:
    """NumPy twin of :func:`log_gamma` (float64), by :math:`X = Y U^{1/\\alpha}`,
    ``Y ~ Gamma(alpha + 1)``: finite for tiny concentrations."""
    alpha = np.asarray(concentration, np.float64)
    return np.log(rng.standard_gamma(alpha + 1.0)) + np.log(rng.random(alpha.shape)) / alpha


#: pseudo-chains the independent draws are split into when grouped by chain
PSEUDO_CHAINS = 4


def num_pseudo_chains(num_draws: int) -> int:
    """How many equal "chains" ``num_draws`` independent draws are shown as (grouped by chain,
    and in ArviZ): :data:`PSEUDO_CHAINS` (else 2, else 1) that divide them with at least four
    draws each. The draws are independent, so any split is as good as another; with more than
    one chain ArviZ's convergence diagnostics are defined (r_hat about 1, ESS about the number
    of draws) instead of warning about one chain."""
    for chains in (PSEUDO_CHAINS, 2):
        if num_draws % chains == 0 and num_draws // chains >= 4:
            return chains
    return 1


def split_chains(x, axis: int = 0):
    """``x`` with its draw axis ``axis`` of length ``S`` split into ``(chains, S / chains)``
    (:func:`num_pseudo_chains`)."""
    x = np.asarray(x)
    s = x.shape[axis]
    c = num_pseudo_chains(s)
    return x.reshape(x.shape[:axis] + (c, s // c) + x.shape[axis + 1:])

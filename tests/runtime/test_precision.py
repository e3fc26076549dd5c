"""The library's programs carry full float32 matrix products (a GPU's TensorFloat-32 default off)."""

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_lm.runtime.precision import full_precision, precise_jit
from numpyro_lm.runtime.programs import program


def _product(a, b, args, kwargs):
    return a @ b


def test_precise_jit_marks_every_product_highest():
    a = jnp.ones((3, 3))
    text = precise_jit(lambda x: (x @ x) @ x).lower(a).as_text()
    assert text.count("stablehlo.dot_general") == 2
    assert text.count("precision = [HIGHEST, HIGHEST]") == 2
    # the plain jit is what a GPU would run in TensorFloat-32: no precision named
    assert "HIGHEST" not in jax.jit(lambda x: x @ x).lower(a).as_text()


def test_full_precision_restores_the_callers_setting():
    full_precision(lambda: None)()
    assert jax.config.jax_default_matmul_precision is None
    jaxpr = jax.make_jaxpr(full_precision(lambda x: x @ x))(jnp.ones((2, 2)))
    assert "HIGHEST" in str(jaxpr)


def test_programs_trace_in_full_precision():
    a = np.arange(4.0, dtype=np.float32).reshape(2, 2)
    run = program(_product)
    np.testing.assert_array_equal(run((a, a)), a @ a)  # same answer on a CPU (float32 either way)
    seen = []
    run_seen = program(lambda a, b, args, kwargs: seen.append(jax.config.jax_default_matmul_precision) or a @ b)
    run_seen((a, a))
    assert seen == ["highest"]

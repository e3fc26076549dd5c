"""The L-BFGS warm start of the mode search.

optax's L-BFGS (zoom line search) is a warm start for dimensions where a Hessian per
step costs too much; :func:`~.newton.newton` then polishes and certifies the mode.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import optax
from jax import lax

__all__ = ["lbfgs"]


def lbfgs(fn: Callable, x0, gtol: float, max_iter: int):
    """optax L-BFGS from ``x0`` until ``max|grad| <= gtol`` or ``max_iter`` iterations.

    Returns ``(x, num_iter, max|grad|)`` (the gradient of the last iteration's start); a warm
    start for :func:`~.newton.newton`, which certifies the mode.
    """
    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(fn)

    def cond(carry):
        _, _, k, gnorm = carry
        return (gnorm > gtol) & (k < max_iter)

    def body(carry):
        x, opt_state, k, _ = carry
        value, grad = value_and_grad(x, state=opt_state)
        updates, opt_state = opt.update(grad, opt_state, x, value=value, grad=grad, value_fn=fn)
        return optax.apply_updates(x, updates), opt_state, k + 1, jnp.max(jnp.abs(grad))

    init = (x0, opt.init(x0), jnp.asarray(0), jnp.asarray(jnp.inf, x0.dtype))
    x, _, num_iter, grad_norm = lax.while_loop(cond, body, init)
    return x, num_iter, grad_norm

"""Which device a fit runs on: the host CPU for small fits, JAX's default device for large ones.

A Laplace fit of a small model is a chain of small programs (Newton steps on a few hundred
coordinates, a few thousand draws), each dispatched and waited for: on an accelerator every
launch and transfer costs more than the arithmetic it carries. Measured on an H100 (jax 0.11.2,
``../shared/GPU.md``): models of fewer than 1000 coordinates were 2-11x slower, cold and warm,
than on two CPU cores; the Poisson random-effect benchmark at N = 5 000 (10^4 latent and observed
numbers) refit in half the CPU's time, the 1000-group logistic GLMM (2 10^4 numbers) in a
seventh, while their first calls, compilation included, stayed slower
(``benchmarks/results/inla_gpu.md``, ``scale_gpu.md``). So by default (``device="auto"``) a fit
whose model holds fewer than :data:`PLACEMENT_NUMBERS` latent and observed numbers (times the
data sets of a batch) runs on the host CPU even where an accelerator is JAX's default device;
larger ones run on the default device. On a machine whose default device is a CPU nothing
changes. ``device="cpu"``, ``"default"`` or a :class:`jax.Device` choose for you.

The fit's data is put on the chosen device (committed), so what is computed later from the
result (draws, weights, the posterior) runs there too.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import jax

__all__ = ["PLACEMENT_NUMBERS", "DEVICES", "check_device", "fit_device", "placed"]

PLACEMENT_NUMBERS = 10_000
"""Latent and observed numbers from which a fit runs on the default accelerator (``device="auto"``):
the smallest model measured faster there when warm (module docstring). The crossover between
the trust suite's models (at most a few hundred numbers: 2-11x slower) and this size was not
measured more finely."""

DEVICES = ("auto", "cpu", "default")


def check_device(device) -> None:
    """Refuse a ``device`` option that is neither one of :data:`DEVICES` nor a :class:`jax.Device`."""
    if not (isinstance(device, jax.Device) or (isinstance(device, str) and device in DEVICES)):
        raise ValueError(f'device must be "auto", "cpu", "default" or a jax.Device, not {device!r}')


def _default_platform() -> str:
    return jax.devices()[0].platform


def _host_cpu() -> Optional[jax.Device]:
    try:
        return jax.devices("cpu")[0]
    except RuntimeError:  # no CPU backend (JAX_PLATFORMS names the accelerator alone): the default then
        return None


def fit_device(device, numbers: int) -> Optional[jax.Device]:
    """The device a fit of ``numbers`` latent and observed numbers runs on, ``None`` for JAX's
    default (module docstring)."""
    if isinstance(device, jax.Device):
        return device
    if device == "default":
        return None
    if device == "cpu":
        return _host_cpu()
    if _default_platform() == "cpu" or numbers >= PLACEMENT_NUMBERS:
        return None
    return _host_cpu()


def placed(device: Optional[jax.Device]):
    """A context in which JAX computes on ``device`` (``None``: as it would anyway)."""
    return contextlib.nullcontext() if device is None else jax.default_device(device)

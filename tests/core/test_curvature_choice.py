"""The choice of curvature (numpyro_lm.core.curvature_choice): the order in which curvature='auto'
tries the structures, the fallback where one fails, the refusal of an explicit structure the
model lacks, and the memory guards that refuse before allocating."""

import warnings

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_lm import LaplaceMatching
from numpyro_lm.curvature import DenseCurvature
from numpyro_lm.core.curvature_choice import (DenseMemoryError, check_dense_memory, choose_curvature,
                                         curvature_candidates, dense_bytes, event_block_bytes, hessian_for)
from numpyro_lm.mode.hessian import ARROWHEAD_MIN_DIM, DenseHessian
from numpyro_lm.core.model import model_info
from numpyro_lm.checks.verdict import NotTrustedWarning
from shared_models import coupled, glmm, glmm_data, wide_data, wide_regression


def layout_of(model, args, kwargs=None):
    return model_info(model, args, kwargs or {}).layout


def test_auto_picks_the_arrowhead_above_the_threshold():
    small, _ = glmm_data(20)
    large, _ = glmm_data(ARROWHEAD_MIN_DIM // 2 + 10)
    layout = lambda args: model_info(glmm, args, glmm_data(args[2])[1]).layout  # noqa: E731
    assert choose_curvature(layout(small)) == "dense"
    assert choose_curvature(layout(large)) == "arrowhead"
    assert choose_curvature(layout(large), "dense") == "dense"


@pytest.mark.slow  # a long end-to-end run: CI=true and make test-all
def test_auto_falls_back_to_dense_where_the_plate_does_not_hold():
    """600 coordinates in a plate (auto picks the arrowhead) that the likelihood couples: the
    probe refuses the structure and the default refits with the dense curvature."""
    y = np.random.default_rng(0).normal(size=600).astype(np.float32)
    lm = LaplaceMatching(coupled, strategy="laplace", progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotTrustedWarning)
        lm.run(jax.random.PRNGKey(0), 600, y=y)
    assert isinstance(lm.state.curvature, DenseCurvature)


@pytest.mark.slow
def test_memory_guard_refuses_before_allocating():
    def wide(y=None):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([200_000]).to_event(1))
        numpyro.sample("y", dist.Normal(w, 1).to_event(1), obs=y)

    assert dense_bytes(200_000, 200_000, 4) > 1e12
    lm = LaplaceMatching(wide, progress_bar=False)
    with pytest.raises(DenseMemoryError, match="200000 latent coordinates.*numpyro.plate"):
        lm.run(jax.random.PRNGKey(0), y=np.zeros(200_000, np.float32))
    info = model_info(wide, (), {"y": jax.ShapeDtypeStruct((200_000,), np.float32)})
    with pytest.raises(DenseMemoryError):
        check_dense_memory(info.layout, 4, "test.")
    # the low-rank update would still form a Dirichlet's covariance as one block (an event vector;
    # a real one this long is matched coordinate by coordinate: core.trace.JOINT_EVENT_MAX)
    def simplex(y=None):
        w = numpyro.sample("w", dist.Dirichlet(np.ones(200_001, np.float32)))
        numpyro.sample("y", dist.Normal(w[1:], 1).to_event(1), obs=y)

    with pytest.raises(DenseMemoryError, match="site 'w' has 200000 coordinates in one event"):
        LaplaceMatching(simplex, curvature="lowrank", progress_bar=False).run(jax.random.PRNGKey(0),
                                                                              y=np.zeros(200_000, np.float32))


def test_candidates_follow_the_models_structure():
    """Below ARROWHEAD_MIN_DIM only dense; a GLMM's plate gives the arrowhead first; a wide
    regression (few observations, no plate structure beyond independent coefficients) gives
    the arrowhead and the exact low-rank update, dense last; an explicit choice is kept alone."""
    small_args, small_kwargs = glmm_data(20)
    assert curvature_candidates(layout_of(glmm, small_args, small_kwargs)) == ["dense"]
    args, kwargs = glmm_data(ARROWHEAD_MIN_DIM // 2 + 10)
    glmm_layout = layout_of(glmm, args, kwargs)
    assert curvature_candidates(glmm_layout)[0] == "arrowhead" and curvature_candidates(glmm_layout)[-1] == "dense"
    x, y = wide_data(n=30, p=ARROWHEAD_MIN_DIM + 50)
    wide = layout_of(wide_regression, (x,), {"y": y})
    assert curvature_candidates(wide) == ["arrowhead", "lowrank", "dense"]
    assert curvature_candidates(wide, "lowrank") == ["lowrank"]
    assert curvature_candidates(wide, "dense") == ["dense"]


def test_an_explicit_structure_the_model_lacks_is_refused_by_name():
    """Every coordinate in one event (no plate): 'arrowhead' is refused naming the reason, a
    named plate that gives no structure is refused naming the plate."""
    def unplated(y=None):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([300]).to_event(1))
        numpyro.sample("y", dist.Normal(w, 1).to_event(1), obs=y)

    layout = layout_of(unplated, (), {"y": np.zeros(300, np.float32)})
    with pytest.raises(ValueError, match="curvature='arrowhead': no plate of the model"):
        curvature_candidates(layout, "arrowhead")
    args, kwargs = glmm_data(ARROWHEAD_MIN_DIM // 2 + 10)
    with pytest.raises(ValueError, match="curvature='lowrank': plate 'obs'"):
        hessian_for(layout_of(glmm, args, kwargs), "lowrank", plate="obs")
    assert isinstance(hessian_for(layout, "dense"), DenseHessian)


def test_event_block_counts_only_sites_matched_as_a_whole():
    """A plate's scalar entries form no dense block; one event vector of 300 forms 300^2."""
    x, y = wide_data(n=30, p=300)
    assert event_block_bytes(layout_of(wide_regression, (x,), {"y": y}), 4) == 0

    def event(y=None):
        w = numpyro.sample("w", dist.MultivariateNormal(np.zeros(300, np.float32), np.eye(300, dtype=np.float32)))
        numpyro.sample("y", dist.Normal(w, 1).to_event(1), obs=y)

    assert event_block_bytes(layout_of(event, (), {"y": np.zeros(300, np.float32)}), 4) == 3 * 4 * 300**2

"""JAX's persistent compilation cache as the library switches it on (numpyro_lm.runtime.compilation_cache)."""

import os
import subprocess
import sys
import textwrap

import jax
import pytest

from numpyro_lm.runtime import compilation_cache
from numpyro_lm.runtime.compilation_cache import ENV, MIN_COMPILE_SECONDS, use_compilation_cache


@pytest.fixture
def clean_jax_cache(monkeypatch):
    """Restore JAX's cache settings and the module's state after the test."""
    before = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    state = dict(compilation_cache._state)
    monkeypatch.delenv(ENV, raising=False)
    yield
    jax.config.update("jax_compilation_cache_dir", before[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
    compilation_cache._state.update(state)


def test_the_cache_goes_where_asked_and_is_taken_back(clean_jax_cache, tmp_path, monkeypatch):
    jax.config.update("jax_compilation_cache_dir", None)
    compilation_cache._state.update(ours=None, choice=None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = use_compilation_cache()
    assert path == str(tmp_path / "numpyro_lm" / "jax") == jax.config.jax_compilation_cache_dir
    assert os.path.isdir(path) and jax.config.jax_persistent_cache_min_compile_time_secs == MIN_COMPILE_SECONDS
    # the user's choice holds over later fits' calls
    assert use_compilation_cache(False) is None and jax.config.jax_compilation_cache_dir is None
    assert use_compilation_cache() is None
    assert use_compilation_cache(True) == path
    # the environment variable switches it off, or names the directory
    monkeypatch.setenv(ENV, "off")
    assert use_compilation_cache() is None and jax.config.jax_compilation_cache_dir is None
    monkeypatch.setenv(ENV, str(tmp_path / "elsewhere"))
    assert use_compilation_cache() == str(tmp_path / "elsewhere")


def test_a_cache_the_user_set_is_left_as_it_is(clean_jax_cache, tmp_path):
    compilation_cache._state.update(ours=None, choice=None)
    theirs = str(tmp_path / "theirs")
    jax.config.update("jax_compilation_cache_dir", theirs)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.0)
    assert use_compilation_cache() == theirs
    assert use_compilation_cache(False) == theirs  # not ours to take back
    assert jax.config.jax_compilation_cache_dir == theirs
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 2.0


SCRIPT = textwrap.dedent("""
    import jax, numpy as np, numpyro, numpyro.distributions as dist
    hits = []
    jax.monitoring.register_event_listener(
        lambda name, **kw: hits.append(name) if name == "/jax/compilation_cache/cache_hits" else None)
    from numpyro_lm import LaplaceMatching

    def model(y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
        sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
        with numpyro.plate("n", 20):
            numpyro.sample("y", dist.Normal(mu, sigma), obs=y)

    y = np.random.default_rng(0).normal(1.0, 0.5, 20).astype(np.float32)
    LaplaceMatching(model, progress_bar=False).run(jax.random.PRNGKey(0), y=y).get_samples()
    print("HITS", len(hits))
""")


@pytest.mark.slow  # two fresh processes: CI=true and make test-all
def test_a_second_process_reads_the_first_ones_programs(tmp_path):
    """Two processes fit the same model: the first writes its programs to the cache, the second
    reads them instead of compiling."""
    env = {**os.environ, ENV: str(tmp_path / "cache"), "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    runs = [subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    hits = [int(run.stdout.split("HITS")[1]) for run in runs]
    assert os.listdir(tmp_path / "cache")  # the first process wrote programs
    # the second read them: this small model's programs that took 0.1 s or more to compile (one)
    assert hits[0] == 0 and hits[1] >= 1, hits

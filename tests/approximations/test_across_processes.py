"""run_many across two JAX processes (numpyro_lm/approximations/across_processes.py): two processes on
localhost, started here with jax.distributed over gloo, fit 64 data sets between them; what each
holds afterwards must be what one process fitting the whole batch holds."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "distributed_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``(reference, [process 0, process 1])``: the worker's records (distributed_worker.py), one
    process alone and two together, all three started at once."""
    one, two = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    port = str(_free_port())
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}
    env.pop("JAX_ENABLE_X64", None)
    started = [subprocess.Popen([sys.executable, WORKER, "0", "1", "0", str(one)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)]
    started += [subprocess.Popen([sys.executable, WORKER, str(p), "2", port, str(two)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for p in (0, 1)]
    for process in started:
        try:
            output, _ = process.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for p in started:
                p.kill()
            pytest.fail("a run_many worker did not finish within 240 s")
        assert process.returncode == 0, output.decode()[-3000:]
    load = lambda path: {k: v.item() if v.dtype.kind == "U" else v  # noqa: E731
                         for k, v in np.load(path, allow_pickle=False).items()}
    return load(one / "process_0.npz"), [load(two / f"process_{p}.npz") for p in (0, 1)]


@pytest.mark.slow
def test_each_process_holds_what_one_process_would(runs):
    reference, processes = runs
    assert reference["process_count"] == 1
    for got in processes:
        assert got["process_count"] == 2
        # the same keys, draw budget and programs per data set: equal up to float32 round-off
        np.testing.assert_allclose(got["samples"], reference["samples"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["concentration"], reference["concentration"], rtol=1e-5)
        np.testing.assert_allclose(got["pareto_k"], reference["pareto_k"], rtol=1e-6, atol=1e-9)
        np.testing.assert_array_equal(got["trusted"], reference["trusted"])
        np.testing.assert_array_equal(got["indices"], np.arange(64))


def test_gather_local_keeps_each_process_share(runs):
    reference, processes = runs
    shares = [got["local_indices"] for got in processes]
    # one CPU device each: 32 data sets a process, in order, together the whole batch
    np.testing.assert_array_equal(np.concatenate(shares), np.arange(64))
    for got, index in zip(processes, shares):
        np.testing.assert_allclose(got["local_samples"], reference["samples"][index], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["local_pareto_k"], reference["pareto_k"][index], rtol=1e-6, atol=1e-9)


def test_a_failed_data_set_is_named_by_every_process(runs):
    reference, processes = runs
    assert reference["raised"].startswith("ObservedDataError: data set 40: observed site 'y'")
    for got in processes:
        # data set 40 is in process 1's share; process 0 raises the same error, by the same index
        assert got["raised"] == reference["raised"]
        assert "data set 40" in got["warned"] and "32 to 63 of 64" in got["warned"]
        np.testing.assert_array_equal(got["kept_finite"], reference["kept_finite"])
        assert got["kept_finite"].sum() == 63

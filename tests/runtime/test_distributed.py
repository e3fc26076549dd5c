"""Shares of a batch across processes and the exchanges between them (numpyro_lm/runtime/distributed.py);
two real processes are in tests/approximations/test_across_processes.py."""

import numpy as np
import pytest

from numpyro_lm.runtime.distributed import allgather_objects, allgather_rows, is_multiprocess, process_share


@pytest.mark.parametrize("total, devices", [(64, [1, 1]), (65, [1, 1]), (10, [4, 1]), (7, [2, 2, 2]), (3, [1, 1, 1])])
def test_shares_cover_the_batch_in_order_and_follow_the_devices(total, devices):
    shares = [process_share(total, devices, p) for p in range(len(devices))]
    assert shares[0].start == 0 and shares[-1].stop == total
    assert all(a.stop == b.start for a, b in zip(shares, shares[1:]))  # contiguous, in process order
    assert all(s.bounds == shares[0].bounds for s in shares)
    per_device = [s.size / d for s, d in zip(shares, devices)]
    assert max(per_device) - min(per_device) <= 1  # every device about as busy


def test_one_process_exchanges_with_itself():
    assert not is_multiprocess()
    assert allgather_objects({"a": 1, "error": ValueError("x")})[0]["a"] == 1
    rows = allgather_rows({"x": np.arange(6.0).reshape(3, 2)})
    np.testing.assert_array_equal(rows["x"], np.arange(6.0).reshape(3, 2))

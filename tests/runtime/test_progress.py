"""numpyro_lm.runtime.progress: a bar only where a person can see it, and only after two seconds."""

import io
import sys

import pytest

from numpyro_lm.runtime.progress import DELAY_SECONDS, progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("stream, enabled, shown", [
    (io.StringIO(), True, False),  # a log file or pipe: nothing written, ever
    (_Terminal(), True, True),
    (_Terminal(), False, False),  # progress_bar=False
])
def test_a_bar_shows_only_on_a_terminal_and_when_asked(monkeypatch, stream, enabled, shown):
    monkeypatch.setattr(sys, "stderr", stream)
    with progress(enabled, total=5, desc="search", file=stream) as bar:
        assert bar.disable is (not shown)
        for _ in range(5):
            bar.update(1)
    # the bar is delayed: five quick updates draw nothing even on a terminal
    assert DELAY_SECONDS == 2.0 and stream.getvalue() == ""

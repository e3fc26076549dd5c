"""The docs' code runs: every ```python block of README.md and docs/*.md, page by page.

A page's blocks run in order in one namespace, after its hidden set-up (an HTML comment
``<!-- setup`` ... ``-->``, which the site does not show). A ```python block followed at once
by a ```text block must print that text (doctest's rules: ``...`` matches anything,
whitespace is normalised), so a claim about output is checked, not just the code. A block
preceded by ``<!-- not run: reason -->`` is skipped for that stated reason (a sketch with
placeholders), and counted: at most a few per page.
"""

import contextlib
import doctest
import io
import pathlib
import re
import warnings

import matplotlib
import pytest

matplotlib.use("Agg")

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"(<!-- not run: [^>]*-->\s*\n)?```python\n(.*?)```\n(\s*```text\n(.*?)```\n)?", re.S)
SETUP = re.compile(r"<!-- setup\n(.*?)-->", re.S)
CHECKER, FLAGS = doctest.OutputChecker(), doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def blocks(page):
    text = page.read_text()
    setup = "\n".join(SETUP.findall(text))
    found = [(m.group(2), m.group(4), m.group(1) is not None, text[: m.start()].count("\n") + 1)
             for m in BLOCK.finditer(text)]
    return setup, found


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_pages_code_runs_and_prints_what_the_page_says(page, tmp_path, monkeypatch, x32):
    # the pages are written for NumPyro's default precision, whatever another test left set
    setup, found = blocks(page)
    monkeypatch.chdir(tmp_path)  # pictures a snippet saves land here
    namespace = {"__name__": f"docs_{page.stem}"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the pages show warnings' texts where they matter
        exec(compile(setup, f"{page.name} (setup)", "exec"), namespace)
        skipped = 0
        for code, expected, not_run, line in found:
            if not_run:
                skipped += 1
                continue
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"{page.name}:{line}", "exec"), namespace)
            if expected is not None and not CHECKER.check_output(expected, out.getvalue(), FLAGS):
                pytest.fail(f"{page.name}:{line} printed\n{out.getvalue()}\nbut the page says\n{expected}")
    assert skipped <= 2, f"{page.name}: {skipped} blocks are not run; make them runnable"


def test_every_page_is_in_the_sites_table_of_contents():
    index = (ROOT / "docs" / "index.md").read_text()
    missing = [p.stem for p in PAGES[1:] if p.stem != "index" and p.stem not in index]
    assert not missing, f"docs/index.md's toctree lacks {missing}"

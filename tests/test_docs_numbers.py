"""The pages quote benchmark numbers as the benchmarks wrote them, not typed by hand.

For README.md and every docs/*.md page, each ratio claim (``6.8x``, ``20-160x``) and each
distance in SDs (``0.04 SD``, ``8.4 NUTS posterior SDs``, ``0.07-0.23 NUTS SD``) in the prose
must appear verbatim (the same digits) in ``benchmarks/results/*.md`` or in the page's own
``<!-- benchmarks/<name>.py -->`` blocks (``... on gpu -->`` for a GPU's), as a number of the same kind: a ratio written
``<n>x`` or ``<n> times`` or in a table column headed ``... x`` or ``... ratio``; an SD
written ``<n> SD`` or in a column about SDs (``sd``, ``SD``, ``gap``, ``err``), in a table
whose caption says it is in SDs, or on a line measuring ``.../sd``. A range needs both ends.
Constants of the method, test settings and mathematical facts are in ``ALLOWED`` instead.

Prose means the page without its fenced code, inline code, HTML comments, marker blocks and
tables. Tables outside the markers are left out on purpose: the ones there (samplers.md's
warm-start and ESS tables, refine.md's MVI-example tables) hold what a script prints
(benchmarks/warm_start.py, examples/ess_vs_lm.py, examples/mvi.py) and no script writes to a
results file yet; they stay hand-copied until one does.
No JAX: this reads text only.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
RESULTS = "\n".join(p.read_text() for p in sorted((ROOT / "benchmarks" / "results").glob("*.md")))

MARKERS = re.compile(r"<!-- (benchmarks/\w+\.py(?: on \w+)?) -->.*?<!-- /\1 -->", re.S)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
COMMENT = re.compile(r"<!--.*?-->", re.S)
INLINE = re.compile(r"`[^`]*`")  # may span a line break
TABLE_ROW = re.compile(r"^\s*\|.*$", re.M)

NUM = r"\d+(?:\.\d+)?(?:e-?\d+)?"
START = r"(?<![\w.\-^])"  # not inside another number, a name, an exponent or a range
RATIO_CLAIM = re.compile(rf"{START}({NUM})(?:-({NUM}))?x\b")
SD_CLAIM = re.compile(rf"{START}({NUM})(?:-({NUM}))?\s+(?:(?:NUTS|posterior|reference|prior)\s+)*SDs?\b")

# Numbers that are not measurements: each (page, claim as written) with why it may stand.
ALLOWED = {
    ("nested.md", "0.2 posterior SDs"): "the stencil's step, a constant of nested/search.py",
    ("nested.md", "0.5 SDs"): "the large models' stencil step, COARSE_STENCIL_SDS in nested/search.py",
    ("nested.md", "0.05 SD"): "the mode search's tolerance, MODE_TOL in nested/search.py",
    ("nested.md", "10 SDs"): "the lattice's extent, MAX_HALF in nested/lattice_design.py",
    ("nested.md", "0.1 SD"): "the large models' mode search tolerance, COARSE_MODE_TOL in nested/search.py",
    ("nested.md", "0.02 SD"): "the interpolated shift's tolerance, INTERPOLATION_SHIFT_TOL in nested/lattice_design.py",
    ("fields.md", "1.5 SDs"): "the long fields' lattice step, LATTICE_LONG in nested/lattice_design.py",
    ("nested.md", "0.1 reference SD"): "tests/approximations/test_nested.py's tolerance for the means",
    ("nested.md", "5x"): "the goal set for the first call, not a measurement",
    ("nested.md", "50x"): "the goal set for compiled fits, not a measurement",
    ("from_nuts.md", "1e-3 posterior SDs"): "the float32 Newton tolerance (optimize.py)",
    ("trust.md", "0.07 SD"): "the verdict's shift threshold, SHIFT_TRUSTED in verdict.py",
    ("trust.md", "3 SDs"): "a second mode's distance threshold, MODE_DISTANCE in verdict.py",
    ("trust.md", "0.1 SD"): "sqrt(1/0.99 - 1): the bound NEAR_UNIFORM_ESS in verdict.py gives",
    ("theory.md", "0.26 SD"): "closed form: a skew-normal(2)'s mode lies 0.26 SD below its mean",
    ("theory.md", "0.1 SD"): "tests/checks/test_psis.py's tolerance for the resampled mean",
    ("samplers.md", "0.26 SD"): "closed form: a skew-normal(2)'s mode lies 0.26 SD below its mean",
}


def prose(text: str) -> str:
    """The page's text with code, comments, marker blocks and tables blanked (lines kept)."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    for pattern in (MARKERS, FENCE, COMMENT, INLINE, TABLE_ROW):
        text = pattern.sub(blank, text)
    return text


def claims(text: str):
    """(kind, claim as written, its numbers, line) for every ratio and SD claim in the prose."""
    text = prose(text)
    for kind, pattern in (("ratio", RATIO_CLAIM), ("sd", SD_CLAIM)):
        for m in pattern.finditer(text):
            numbers = [n for n in m.groups() if n is not None]
            yield kind, " ".join(m.group(0).split()), numbers, text[: m.start()].count("\n") + 1


def _tables(text: str):
    """(caption, header cells, rows of cells) of every markdown table in ``text``."""
    lines, caption, i = text.splitlines(), "", 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("|") and i + 1 < len(lines) and lines[i + 1].strip().startswith("|---"):
            header = [c.strip() for c in line.strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            yield caption, header, rows
            continue
        if line:
            caption = line
        i += 1


def _numbers(cell: str):
    return re.findall(rf"{START}{NUM}", re.sub(r"\[[^\]]*\]", "", cell))


def quoted_values(sources: str):
    """The ratios and the SDs that ``sources`` (results files, marker blocks) state."""
    ratios = set(re.findall(rf"{START}({NUM})\s?(?:x\b|times\b)", sources))
    sds = set(re.findall(rf"{START}({NUM})\s+(?:(?:NUTS|posterior|reference)\s+)*(?:SDs?|sd)\b", sources))
    for line in sources.splitlines():
        if not line.lstrip().startswith("|") and re.search(r"(?i)/\s?sd\b", line):
            sds.update(_numbers(line))  # "LM W1/sd <= 0.10: 13 of 14 models"
    for caption, header, rows in _tables(sources):
        in_sds = re.search(r"\bSDs?\b", caption) is not None  # "..., in NUTS SDs (...)"
        for j, head in enumerate(header):
            is_ratio = re.search(r"(?i)(\bx$|ratio)", head) is not None
            is_sd = in_sds or re.search(r"(?i)((?<![a-z])sd(?![a-z])|gap|err)", head) is not None
            for row in rows:
                if j < len(row):
                    if is_ratio:
                        ratios.update(_numbers(row[j]))
                    if is_sd:
                        sds.update(_numbers(row[j]))
    return {"ratio": ratios, "sd": sds}


def _name(page: pathlib.Path) -> str:
    return page.name


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_quoted_ratio_and_sd_comes_from_a_results_file(page):
    text = page.read_text()
    known = quoted_values(RESULTS + "\n" + "\n".join(m.group(0) for m in MARKERS.finditer(text)))
    missing = [f"{page.name}:{line}: {claim!r} ({kind})" for kind, claim, numbers, line in claims(text)
               if (page.name, claim) not in ALLOWED and not all(n in known[kind] for n in numbers)]
    assert not missing, ("numbers typed by hand, found in no benchmarks/results/*.md: quote the results "
                         "file (and name it), or point to the table; only constants go in ALLOWED:\n"
                         + "\n".join(missing))


def test_the_allow_list_names_claims_the_pages_still_make():
    made = {(page.name, claim) for page in PAGES for _, claim, _, _ in claims(page.read_text())}
    stale = sorted(set(ALLOWED) - made)
    assert not stale, f"ALLOWED lists claims no page makes any more: {stale}"


def test_the_extraction_sees_what_it_should():
    text = ("within 0.04 SD, 8.4 NUTS posterior SDs and 0.07-0.23 NUTS SD; 20-160x and 6.8x faster.\n"
            "`y = 0.3 x sin(0.7x)` and\n```python\nratio = 5x\n```\n| 9x | table |\n"
            "<!-- benchmarks/run.py -->\n12x\n<!-- /benchmarks/run.py -->\n")
    found = {(kind, claim) for kind, claim, _, _ in claims(text)}
    assert found == {("sd", "0.04 SD"), ("sd", "8.4 NUTS posterior SDs"), ("sd", "0.07-0.23 NUTS SD"),
                     ("ratio", "20-160x"), ("ratio", "6.8x")}
    known = quoted_values("| model | cold x | err / sd |\n|---|---|---|\n| a | 6.5 | 0.038 / 0.029 |\n"
                          "a 674x faster, 1656 times; more than 0.3 SD off\n- LM W1/sd <= 0.10: 13 of 14\n")
    assert {"6.5", "674", "1656"} <= known["ratio"] and {"0.038", "0.029", "0.3", "0.10"} <= known["sd"]
    assert "0.04" not in known["sd"] and "0.03" not in known["sd"]  # digits as written: 0.04 is not 0.040

"""Sphinx configuration: ``make docs`` builds the site into ``docs/_build/html`` with warnings
as errors. Sphinx because the docstrings are reStructuredText (``:param:`` fields and
``.. math::``, as NumPyro's are) and autodoc renders them as written; the pages are Markdown
through MyST; the theme is NumPyro's (Read the Docs); examples render with sphinx-gallery."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "numpyro_lm"
author = "the numpyro_lm developers"
copyright = "2026, the numpyro_lm developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.intersphinx",
    "sphinx_gallery.gen_gallery",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "auto_examples/*.ipynb", "auto_examples/*.py", "auto_examples/*.zip",
                    "auto_examples/*.json", "auto_examples/*.md5", "**/sg_execution_times.rst"]
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3
suppress_warnings = ["myst.xref_missing"]  # links to source files outside the site

autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_typehints = "none"  # the :param: fields say what each argument is
autosummary_generate = False

# offline builds: no inventories are fetched
intersphinx_mapping = {}

html_theme = "sphinx_rtd_theme"
html_title = "numpyro_lm"

sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    # executed at build time (seconds each); the others are shown with their code and output files
    "filename_pattern": r"/(quickstart|did_it_work|calibration)\.py$",
    "ignore_pattern": r"__init__\.py",
    "download_all_examples": False,
    "remove_config_comments": True,
    "matplotlib_animations": False,
    "image_scrapers": ("matplotlib",),
    "abort_on_example_error": True,
    "only_warn_on_example_error": False,
}

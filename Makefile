# `make demo` and `make test` do all the set-up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: demo test test-all bench docs install install-dev clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# The stamp files reinstall when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(PY)
	$(PIP) install --quiet -e ".[plot,data]"
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(PY)
	$(PIP) install --quiet -e ".[dev,plot,data]"
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(PY) examples/quickstart.py

# A worker that crashes ends the run at once: once (of six runs) XLA segfaulted while compiling
# and the replacement worker hung the suite instead of failing it. Tests marked slow (long
# end-to-end runs: the docs' pages, MCMC chains, the third-party models, large structured fits,
# and any test over about 3 s on 2 cores) run where CI=true, and with `make test-all`; the default
# subset keeps a fresh clone's `make test` under 5 minutes on 2 cores.
SLOW := $(if $(CI),,-m "not slow")
test: $(VENV)/.installed-dev
	$(PY) -m pytest -q -n auto --dist loadfile --max-worker-restart=0 $(SLOW) tests

test-all: $(VENV)/.installed-dev
	$(PY) -m pytest -q -n auto --dist loadfile --max-worker-restart=0 tests

bench: $(VENV)/.installed
	$(PIP) install --quiet -e ".[plot,data,peers]"
	$(PY) benchmarks/run.py
	$(PY) benchmarks/warm_start.py
	$(PY) benchmarks/refine.py
	$(PY) benchmarks/nested.py
	$(PY) benchmarks/batch.py
	$(PY) benchmarks/processes.py
	$(PY) benchmarks/placement.py
	$(PY) benchmarks/trust.py
	$(PY) benchmarks/third_party.py
	$(PY) benchmarks/lm_gp.py
	$(PY) benchmarks/bnn_bridge.py
	$(PY) benchmarks/scale.py
	$(PY) benchmarks/piham.py
	$(PY) benchmarks/piham_calibration.py
	$(PY) benchmarks/laplace_nuts.py
	$(PY) benchmarks/laplace_nuts_seeds.py
	$(PY) benchmarks/laplace_nuts_timing.py
	$(PY) benchmarks/latent_gp.py
	$(PY) benchmarks/fields.py
	$(PY) benchmarks/fields_long.py
	$(PY) benchmarks/inla.py

# The site, warnings as errors; the quick examples run as it builds (sphinx-gallery).
docs: $(VENV)/.installed-docs
	$(PY) -m sphinx -W --keep-going -b html -j auto docs docs/_build/html

$(VENV)/.installed-docs: pyproject.toml | $(PY)
	$(PIP) install --quiet -e ".[docs,plot]"
	touch $@ $(VENV)/.installed

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache docs/_build docs/auto_examples

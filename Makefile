# make search   set up .venv, then run the search (or, until scripts/search.py exists, one AR generation)
# make test     set up .venv and the torch reference venv .venv-ref, then run every CPU test
SHELL := bash

PYTHON312 := $(or $(wildcard $(HOME)/.pyenv/versions/3.12.1/bin/python),python3.12)
PYTHON311 := $(or $(wildcard $(HOME)/.pyenv/versions/3.11.7/bin/python),python3.11)
VENV := .venv
REF_VENV := .venv-ref
# The HF parity reference: CPU torch under Python 3.11 (see README, Decisions).
REF_PACKAGES := torch==2.13.0 transformers safetensors numpy

.PHONY: search test venv ref-venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON312) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q -e '.[test]'
	touch $@

ref-venv: $(REF_VENV)/.installed

$(REF_VENV)/.installed:
	test -x $(REF_VENV)/bin/python || $(PYTHON311) -m venv $(REF_VENV)
	$(REF_VENV)/bin/python -m pip install -q $(REF_PACKAGES)
	touch $@

test: venv ref-venv
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile --durations=15 tests

search: venv
	if [ -f scripts/search.py ]; then $(VENV)/bin/python scripts/search.py; \
	else $(VENV)/bin/python scripts/generate.py engine=ar; fi

# Keeps both venvs (rebuilding .venv-ref reinstalls torch); `rm -rf .venv .venv-ref` for a fresh start.
clean:
	rm -rf outputs multirun .pytest_cache .cache/hf_reference *.egg-info
	find . -path ./.venv -prune -o -path ./.venv-ref -prune -o -name __pycache__ -type d -print0 | xargs -0 rm -rf

# make search   set up .venv, then run the search
# make test     set up .venv and the torch reference venv .venv-ref, then run every CPU test
# make wheels   .whl/: the pure-Python packages the H200 machine lacks (Hydra, pydantic, pytest), for
#               `carry: [".whl"]` in device runs (scripts/h200/*.sh, docs/search.md)
SHELL := bash

PYTHON312 := $(or $(wildcard $(HOME)/.pyenv/versions/3.12.1/bin/python),python3.12)
PYTHON311 := $(or $(wildcard $(HOME)/.pyenv/versions/3.11.7/bin/python),python3.11)
VENV := .venv
REF_VENV := .venv-ref
# The HF parity reference: CPU torch under Python 3.11 (see README, Decisions).
REF_PACKAGES := torch==2.13.0 transformers safetensors numpy

.PHONY: search test venv ref-venv wheels clean

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
	$(VENV)/bin/python scripts/search.py

# Versions as pinned in .venv at the time of writing; antlr4 4.9.3 exists only as a source package.
WHEELS := hydra-core==1.3.8 omegaconf==2.3.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
	typing-inspection==0.4.5 typing-extensions==4.16.0 PyYAML==6.0.4 packaging==26.4 pytest==9.2.0 pluggy==1.7.0 \
	iniconfig==2.3.1 pytest-xdist==3.8.0 execnet==2.1.2
wheels: venv
	$(VENV)/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .whl $(WHEELS)
	$(VENV)/bin/python -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3

# Keeps both venvs (rebuilding .venv-ref reinstalls torch); `rm -rf .venv .venv-ref` for a fresh start.
clean:
	rm -rf outputs multirun .pytest_cache .cache/hf_reference *.egg-info
	find . -path ./.venv -prune -o -path ./.venv-ref -prune -o -name __pycache__ -type d -print0 | xargs -0 rm -rf

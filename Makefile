VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
HWLAT  := $(VENV)/bin/hwlat

.PHONY: run test lint clean

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e '.[zoo,plot]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e '.[zoo,plot,test]'
	touch $@ $(VENV)/.installed-run

run: $(VENV)/.installed-run
	$(HWLAT) quickstart

test: $(VENV)/.installed-test
	$(PY) -m pytest

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info

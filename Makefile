# unity — every dependency comes from setup.cfg, installed into a local virtualenv.
VENV   ?= .venv
PY     := $(VENV)/bin/python
UNITY  := $(VENV)/bin/unity
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint bench clean

setup: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: setup
	$(UNITY) optimize examples/bert_tiny.onnx --cluster cluster_specs/dgx-a100-8.yaml --batch-size 64 --out plan.json

test: setup
	$(PY) -m pytest

lint: setup
	$(VENV)/bin/ruff check unity_cli tests benchmarks

bench: setup
	$(PY) benchmarks/foundation.py

clean:
	rm -rf $(VENV) build *.egg-info plan.json

# unity — every dependency comes from setup.cfg, installed into a local virtualenv.
VENV   ?= .venv
PY     := $(VENV)/bin/python
UNITY  := $(VENV)/bin/unity
STAMP  := $(VENV)/.installed

.PHONY: setup demo run-demo test lint bench paper accuracy gpu-check hf-corpus hf-bench clean

setup: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: setup
	$(UNITY) optimize examples/bert_tiny.onnx --cluster cluster_specs/dgx-a100-8.yaml --batch-size 64 --out plan.json

run-demo: setup
	$(UNITY) optimize examples/bert_tiny.onnx --cluster cluster_specs/local-cpu.yaml --out plan.json
	$(VENV)/bin/mpiexec -n 2 $(UNITY) run plan.json --check

# On as many processes as the machine has cores (-n auto: 2 on CI), an idle one taking tests
# from a busy one's queue (--dist worksteal: the slow search tests do not end the run alone);
# `pytest FILE` runs serially.
test: setup
	$(PY) -m pytest -n auto --dist worksteal

lint: setup
	$(VENV)/bin/ruff check unity_cli tests benchmarks
	$(VENV)/bin/lint-imports

bench: setup
	$(PY) benchmarks/foundation.py

# On a machine with an NVIDIA GPU: cupy kernels, unity run --backend cupy, NCCL, profiler -> gpu-check/
gpu-check: setup
	$(PY) -m pip install -q --disable-pip-version-check -e '.[gpu]'
	PATH=$(VENV)/bin:$$PATH benchmarks/gpu_check.sh gpu-check

# The Unity paper's benchmark: 7 DNNs x {8, 48, 192} Summit GPUs x 5 strategies -> benchmarks/results/paper.{md,csv}
# and docs/paper_speedup.png (matplotlib comes from the 'bench' extra); 7-11 min on 2 cores.
paper: setup
	$(PY) -m pip install -q --disable-pip-version-check -e '.[bench]'
	$(PY) benchmarks/paper.py

# Cost-model accuracy: plan small models for 2 CPU ranks, train each plan with MPI -> benchmarks/results/accuracy.*
accuracy: setup
	$(PY) benchmarks/accuracy.py

# Re-export the Hugging Face corpus of tests/models/hf/ (torch 2.13.0 is a CPU build on local disk here).
hf-corpus: setup
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e '.[export]'
	$(PY) tests/models/export_hf.py

# The README's table of the models people train today: what each needs, and the plan it gets.
hf-bench: setup
	$(PY) benchmarks/hf_models.py

clean:
	rm -rf $(VENV) build *.egg-info plan.json gpu-check

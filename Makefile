# Two commands for a new user: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.poslab-installed

.PHONY: install demo test test-slow lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned, so pip never resolves a bare (multi-GB CUDA) torch
	$(PY) -m pip install -q torch==2.13.0
	# the Ray extra too: tests/test_ray.py runs on every fresh clone and in CI
	$(PY) -m pip install -q -e '.[test,ray]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	# every experiment of the lessons (quick forms; finished steps are reused) -> runs/lab/report.html
	$(VENV)/bin/poslab lab --quick
	# a poem from the demo poem model (preset tang-demo: the lab's Tang GPT with RoPE and a 64-character
	# block, about 70 s of training on 2 cores; --resume reuses a finished run) -> runs/tang-demo; the poem
	# is the model's block: the prompt and 59 sampled characters
	$(VENV)/bin/poslab train --preset tang-demo --resume
	$(VENV)/bin/poslab sample runs/tang-demo --prompt 白日依山尽 --tokens 64 --seed 0
	@echo "open runs/lab/report.html"

# the default suite on 2 pytest-xdist workers of one torch thread each (tests/conftest.py);
# `make test WORKERS=0` runs it in this one process
WORKERS ?= 2

test: install
	$(PY) -m pytest -q -n $(WORKERS)

test-slow: install
	$(PY) -m pytest -q -m slow

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) runs

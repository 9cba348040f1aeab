# The README's two commands: `make demo` and `make test`. Both set themselves up.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
DEMO := demo

.PHONY: demo test check bench mutants venv clean

# uv installs the environment in about a third of pip's time (benchmarks/NOTES.md); pip stays in the
# environment for the README's other installs.
$(BIN)/python:
	$(shell command -v $(PYTHON) || echo python3) -m venv $(VENV)
	$(BIN)/pip install -q uv

# --compile-bytecode: imports then read compiled modules, as after a pip install
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -e '.[test]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(MAKE) --no-print-directory -f recipes/quickstart.mk OUT=$(DEMO) JEPA=$(abspath $(BIN))/jepa PYTHON=$(abspath $(BIN))/python

test: venv
	$(BIN)/python -m pytest

# The fast tier for the edit-test loop: everything but the tests marked `@pytest.mark.slow` (or whose file
# sets `pytestmark = pytest.mark.slow`).
check: venv
	$(BIN)/python -m pytest -m "not slow"

# Every benchmark, one table. REFERENCE=DIR (a facebookresearch/ijepa checkout) with REFERENCE_PYTHON
# (a Python with torch, e.g. `pip install torch==2.13.0`) measures the official step in the same run.
bench: venv
	$(BIN)/python benchmarks/all.py $(if $(REFERENCE),--reference $(REFERENCE) --reference-python $(or $(REFERENCE_PYTHON),$(BIN)/python))

# Declared one-line bugs (scripts/mutants.py), each applied to a temporary copy of the tree: the tests named
# for it must fail. Exits non-zero when fewer than 90 % are caught.
mutants: venv
	$(BIN)/python scripts/mutants.py

clean:
	rm -rf $(VENV) $(DEMO)

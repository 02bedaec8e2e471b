# The two commands of the README: `make up` (the main job) and `make test`.
# Each installs what it needs first (scripts/install.sh, once per change).
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: up serve test install

$(VENV)/.installed: pyproject.toml scripts/install.sh scripts/progress.sh
	VENV=$(VENV) bash scripts/install.sh

install: $(VENV)/.installed

up: $(VENV)/.installed
	bash scripts/system-deps.sh --serve
	$(PY) -m tailguard up --port $(PORT) $(UP_ARGS)

serve: $(VENV)/.installed
	bash scripts/system-deps.sh --serve
	$(PY) -m tailguard serve --port $(PORT)

test: $(VENV)/.installed
	bash scripts/system-deps.sh
	$(PY) -m pytest -q $(PYTEST_ARGS)

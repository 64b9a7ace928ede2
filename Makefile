# Two commands do everything on a fresh machine: `make compare` (the main job) and `make test`.
# Both create .venv and install tokenmix with the pinned torch when needed. A .venv that already holds
# a working install of this checkout (README's manual install) is kept, not reinstalled: without a
# stamp yet, make checks that it imports tokenmix from here, torch, pytest and ruff.
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
WORKS  := import tokenmix, torch, pytest, ruff, sys; sys.exit(not tokenmix.__file__.startswith('$(CURDIR)/'))

.PHONY: compare demo test bench clean-venv

$(STAMP): pyproject.toml
	@if [ ! -e $(STAMP) ] && [ -x $(BIN)/python ] && $(BIN)/python -c "$(WORKS)" 2>/dev/null; then \
		echo "make: $(VENV) already holds a working install; keeping it"; \
	else \
		set -e; \
		test -x $(BIN)/python || python3 -m venv $(VENV); \
		echo "$(BIN)/pip install --quiet torch==2.13.0 -e '.[dev]'"; \
		$(BIN)/pip install --quiet torch==2.13.0 -e '.[dev]'; \
	fi
	touch $(STAMP)

compare: $(STAMP)
	$(BIN)/tokenmix compare

demo: $(STAMP)
	$(BIN)/tokenmix demo

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/tokenmix bench solver
	$(BIN)/tokenmix bench decode

clean-venv:
	rm -rf $(VENV)

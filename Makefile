# Two commands do everything on a fresh machine: `make compare` (the main job) and `make test`.
# Both create .venv and install tokenmix with the pinned CPU torch when needed.
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: compare demo test bench clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0 -e '.[dev]'
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

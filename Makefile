# Two commands do everything: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
# OMP_WAIT_POLICY is chosen per command by the app (app/__init__.py): PASSIVE for `ltd serve` only.
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1

.PHONY: demo test install install-test browser-deps java-deps bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Stamps re-run the install whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: install
	$(BIN)/ltd demo $(ARGS)

# Headless Chromium for the browser test (Debian package). Needs root + apt; without them the
# browser test is skipped and says why.
browser-deps:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium (apt-get) for the browser test"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
			|| echo "chromium install failed: the browser test will be skipped"; \
	else echo "chromium not installed and no root/apt-get: the browser test will be skipped"; fi

# A Java runtime for METEOR (pycocoevalcap runs its jar) and the tokenizer cross-check test (Debian
# package). Needs root + apt; without Java, `ltd caption eval` leaves METEOR out and says why.
java-deps:
	@if command -v java >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing default-jre-headless (apt-get) for METEOR"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless >/dev/null) \
			|| echo "JRE install failed: METEOR will be skipped"; \
	else echo "java not installed and no root/apt-get: METEOR will be skipped"; fi

test: install-test browser-deps java-deps
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install-test
	$(BIN)/python bench/train_throughput.py
	$(BIN)/python bench/eval_speed.py
	$(BIN)/python bench/data_synth.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

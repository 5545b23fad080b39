# Two entry points that work on a fresh machine:
#   make site   set up .venv and build the embedded example (examples/tiny-asr) into dist/
#   make test   set up .venv (and espeak-ng + chromium through apt when missing), lint, and run every test
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup system-deps site lint test test-python test-js e2e clean

$(STAMP): pyproject.toml package.json package-lock.json
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU build of torch; an unpinned torch would pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[zoo,test]"
	# onnxruntime-web, pinned in package-lock.json: the build copies its files into every site
	npm ci --no-audit --no-fund
	touch $@

setup: $(STAMP)

# espeak-ng makes the speech, chromium runs the site; installed only when missing.
system-deps:
	@command -v espeak-ng >/dev/null && command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q espeak-ng chromium; \
	  else echo "install espeak-ng and chromium (e.g. sudo apt-get install espeak-ng chromium)"; exit 1; fi; }

site: setup
	$(VENV)/bin/webbuild examples/tiny-asr/model.yaml -o dist

# ruff, configured in pyproject.toml ([tool.ruff]); first, because it takes a second and the tests minutes
lint: setup
	$(VENV)/bin/ruff check .

test: setup lint system-deps test-python test-js e2e

test-python:
	$(PY) -m pytest -q

test-js:
	node --test tests/js/

# `webbuild verify` on the embedded example, as a deployer would run it: the 4 samples on the page's own
# choice (SwiftShader WebGPU here), 20 held-out clips on wasm (SwiftShader is ~100x slower), and
# the cache / corrupted shard / fallback / origin / console checks. The report is kept in
# e2e-report.json and printed; held-out clips may differ from their transcript by one word in four
# (the model's held-out WER is 2.9%), but must equal the Python reference exactly.
E2E_DIR ?= /tmp/webbuild-e2e
e2e: setup system-deps
	rm -rf $(E2E_DIR) && mkdir -p $(E2E_DIR)
	$(VENV)/bin/webbuild examples/tiny-asr/model.yaml -o $(E2E_DIR)/dist
	$(PY) -m webbuild.train.clips $(E2E_DIR)/clips --count 20
	@start=$$(date +%s); rc=0; \
	$(VENV)/bin/webbuild verify $(E2E_DIR)/dist --clips $(E2E_DIR)/clips --clips-ep wasm --clips-max-wer 0.25 \
	  --json e2e-report.json || rc=$$?; \
	echo "--- e2e-report.json"; cat e2e-report.json; \
	echo "webbuild verify took $$(( $$(date +%s) - start )) s"; exit $$rc

clean:
	rm -rf dist $(VENV)

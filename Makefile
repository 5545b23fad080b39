# Two entry points that work on a fresh machine:
#   make site   set up .venv without torch and build the embedded example (examples/tiny-asr) into dist/
#   make test   + the zoo/test extras (torch), espeak-ng, chromium and firefox-esr through apt when missing; lint,
#               every test
# and, while developing, make check: lint and the tests that need neither torch nor a browser (no torch installed)
VENV ?= .venv
PY := $(VENV)/bin/python
# no -q: pip prints a line per package, so a minutes-long install is never silent
PIP := $(PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.installed
CHECK_STAMP := $(VENV)/.installed-check
TEST_STAMP := $(VENV)/.installed-test
# Extras of `make test`. torch is pinned in the zoo extra; on Linux x86-64 the package index's build of
# that version is the CUDA one (2.7 GB of wheels), a machine whose pip sees the +cpu wheel (a find-links
# folder or PyTorch's CPU index, README.md "Install") gets the 0.19 GB CPU build instead.
TEST_EXTRAS ?= zoo,test

.PHONY: setup setup-check setup-test system-deps ort site lint ruff typecheck-py typecheck-js check test test-python fuzz \
  test-check test-js e2e optimum-fixtures clean

# The main job (build a site from an export, serve, verify, bench) needs no torch, and of npm's packages only
# onnxruntime-web (package.json's dependencies; its devDependencies are the tests' and tsc's: setup-check)
$(STAMP): pyproject.toml setup.py package.json package-lock.json webbuild/site/ort.lock.json webbuild/site/vad.lock.json
	@echo "== [1/3] python venv in $(VENV)"
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@echo "== [2/3] onnxruntime-web, pinned in package-lock.json, without the dev packages"
	npm ci --omit=dev --no-audit --no-fund
	@echo "== [3/3] webbuild and its dependencies (no torch; about 110 MB of wheels); setup.py copies"
	@echo "   onnxruntime-web's site files into webbuild/site/onnxruntime-web/ (checked against webbuild/site/ort.lock.json)"
	$(PIP) install -e .
	touch $@

setup: $(STAMP)

# The onnxruntime-web files a site ships, package data in webbuild/site/onnxruntime-web/ (and Silero VAD's model in
# webbuild/site/silero-vad/): setup.py puts them there at install; this checks them (a second or less) and copies
# them again from node_modules where they are missing
ort: setup
	$(PY) -m webbuild.site.ort_files

# `make check`'s tools (pytest, ruff): no torch, no browser
$(CHECK_STAMP): $(STAMP) pyproject.toml
	@echo "== check extra: pytest, jsonschema, safetensors, ruff; npm's dev packages (typescript, webgpu, puppeteer-core)"
	$(PIP) install -e ".[check]"
	npm ci --no-audit --no-fund
	touch $@

setup-check: $(CHECK_STAMP)

$(TEST_STAMP): $(CHECK_STAMP) pyproject.toml
	@echo "== test extras [$(TEST_EXTRAS)]: torch, transformers, playwright, onnxruntime-genai, peft"
	$(PIP) install -e ".[$(TEST_EXTRAS)]"
	touch $@

setup-test: $(TEST_STAMP)

# espeak-ng makes the speech, chromium runs the site, firefox-esr runs it too (the second browser,
# tests/e2e/test_firefox.py); each package's command has its name. Those missing are installed, without
# Recommends (those add ~160 packages: avahi, CUPS and polkit helpers, perl; the headless browsers and
# espeak-ng need none).
SYSTEM_DEPS := espeak-ng chromium firefox-esr
system-deps:
	@missing=""; for p in $(SYSTEM_DEPS); do command -v $$p >/dev/null || missing="$$missing $$p"; done; \
	[ -z "$$missing" ] || { \
	  if [ "$$(id -u)" = 0 ]; then echo "== apt:$$missing"; apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null \
	    && echo "installed$$missing"; \
	  else echo "install$$missing (e.g. sudo apt-get install --no-install-recommends$$missing)"; \
	    exit 1; fi; }

site: setup ort
	$(VENV)/bin/webbuild examples/tiny-asr/model.yaml -o dist
	@echo
	@echo "built dist/. Preview it (then open http://127.0.0.1:8000/):"
	@echo "  $(VENV)/bin/webbuild serve dist"

# Every static check, first, because they take seconds and the tests minutes
lint: ruff typecheck-py typecheck-js

# configured in pyproject.toml ([tool.ruff])
ruff: setup-check
	$(VENV)/bin/ruff check .

# mypy on webbuild/, configured in pyproject.toml ([tool.mypy]); its cache (.mypy_cache) makes a rerun take
# about a second, a cold run about 10 s on the 2-core box
typecheck-py: setup-check
	$(PY) -m mypy

# tsc --checkJs on the browser runtime and the Node bench harnesses (tsconfig.json; typescript and
# @webgpu/types are devDependencies in package-lock.json, installed by setup-check's npm ci)
typecheck-js: setup-check
	node_modules/.bin/tsc -p tsconfig.json

# The lane of every test that needs neither torch, nor a browser, nor SwiftShader's WebGPU, nor installs webbuild
# afresh (markers that
# tests/conftest.py gives each test from its fixtures and imports): a few minutes, for every change
LANE := not torch and not browser and not webgpu and not install
# pytest-xdist workers: most tests wait on one core (a subprocess, a page), so two keep a 2-core machine busy
# (what several tests read is made once a run: tests/conftest.py run_wide)
PYTEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(PYTEST_WORKERS)
check: lint test-check

# the fuzz harness's fixed-seed cases: 200 in `make test`, fewer here (about 0.5 s a case), 1000 in `make fuzz`
CHECK_FUZZ_CASES ?= 60
test-check: setup-check ort
	WEBBUILD_FUZZ_CASES=$(CHECK_FUZZ_CASES) $(PYTEST) -m "$(LANE)"

test: setup-test lint system-deps optimum-fixtures test-python test-js e2e

# The Hugging Face Optimum exports the fusion tests fuse (tests/fusion/exporters.py): the exporter's own
# venv (its transformers is not the zoo's) and five tiny random-weight decoders, cached under
# ~/.cache/webbuild (or $WEBBUILD_CACHE) by versions; timed, as a fresh machine pays it once
optimum-fixtures: setup-test
	@start=$$(date +%s); $(PY) -m tests.fusion.exporters && \
	  echo "optimum fixtures took $$(( $$(date +%s) - start )) s"

test-python: setup-test ort
	$(PYTEST)

test-js: ort
	node --test tests/js/

# `webbuild verify` on the embedded example, as a deployer would run it: the 4 samples on wasm with every run verify
# makes of them (the adapter on and off, each language forced, a context), 20 held-out clips on wasm, the first
# E2E_WEBGPU_CLIPS of them on WebGPU (--clips-ep webgpu: SwiftShader here, where the page's own choice is wasm), and
# the cache / corrupted shard / fallback / origin / console checks. The full report stays in e2e-report.json; a short
# summary (scripts/e2e_summary.py) ends the output, the last lines of `make test`. The held-out clips come at four
# source rates, round robin (webbuild.train.clips --rates; x2: stereo): the page resamples them with the project's
# resampler and must give the Python reference's tokens at every rate on both EPs (a RATE line each in the summary);
# a token may differ only where the page and the reference were both within MAX_TIE_MARGIN of another token
# (webbuild/tools/verify/tokens.py), and such clips are counted apart ("passed under the margin"). --clips-max-wer
# bounds each provider's corpus WER: the example's English held-out clips gave 3.64% over these 20 on wasm and 4.76%
# over WebGPU's 4 (2026-12-07, the third multilingual model), so the bound of 15% is a floor against a broken site, not
# the model's figure; the tokens equal to the reference are the test.
# Why 4 of the 20 on WebGPU, one per rate, and the samples' runs on wasm: SwiftShader decodes ~2-3 tokens/s, ~100x
# slower than wasm, 13-20 s a clip on the 2-core box; the samples' 20 runs there took 4 of the e2e's 5.5 minutes
# (2026-12-07). The adapter on WebGPU is tests/test_site_example.py's (a clip it changes, on SwiftShader); the
# languages and the context are the prompt's tokens, which the page makes alike for both EPs. `make e2e
# E2E_EP=webgpu E2E_WEBGPU_CLIPS=20` runs everything on WebGPU too. --live off: the live check plays audio in real
# time, which SwiftShader's WebGPU cannot follow; its run is on wasm, in pytest (tests/e2e/test_live.py and the green
# verify).
E2E_EP ?= wasm
E2E_WEBGPU_CLIPS ?= 4
E2E_RATES ?= 22050,44100x2,48000,16000
E2E_DIR ?= /tmp/webbuild-e2e
e2e: setup-test system-deps ort
	rm -rf $(E2E_DIR) e2e-report.json && mkdir -p $(E2E_DIR)
	$(VENV)/bin/webbuild examples/tiny-asr/model.yaml -o $(E2E_DIR)/dist
	$(PY) -m webbuild.train.clips $(E2E_DIR)/clips --count 20 --rates $(E2E_RATES)
	@start=$$(date +%s); rc=0; \
	$(VENV)/bin/webbuild verify $(E2E_DIR)/dist --ep $(E2E_EP) --clips $(E2E_DIR)/clips --clips-ep wasm \
	  --clips-ep webgpu:$(E2E_WEBGPU_CLIPS) --clips-max-wer 0.15 --live off --json e2e-report.json || rc=$$?; \
	$(PY) scripts/e2e_summary.py e2e-report.json --seconds $$(( $$(date +%s) - start )) --rc $$rc; exit $$rc

clean:
	rm -rf dist $(VENV)

# The fuzz harness (tests/fuzz.py) with a larger budget than the test run's 200 cases: random corruptions of
# every input through build, fuse and transcribe; the tally goes to fuzz-report.json (BENCHMARKS.md)
FUZZ_CASES ?= 1000
fuzz: setup-check
	WEBBUILD_FUZZ_CASES=$(FUZZ_CASES) WEBBUILD_FUZZ_REPORT=fuzz-report.json $(PY) -m pytest tests/test_fuzz.py -p no:logging

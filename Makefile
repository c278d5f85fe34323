# The two commands of the README: `make demo` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# ccache (Debian's package) makes rebuilds of the ATen-heavy units fast.
export PATH := $(if $(wildcard /usr/lib/ccache),/usr/lib/ccache:,)$(PATH)
export MAX_JOBS ?= 2

.PHONY: demo test build pytest runtime-test bench clean system-deps

# Debian packages: GoogleTest for runtime/ tests, ccache for rebuilds.
system-deps:
	@if [ ! -e /usr/include/gtest/gtest.h ] || ! command -v ccache >/dev/null; then \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && apt-get install -y -qq libgtest-dev ccache >/dev/null) || \
	      echo "warning: could not install libgtest-dev/ccache"; \
	  else echo "warning: install libgtest-dev and ccache (apt-get) for the C++ tests"; fi; \
	fi

$(VENV)/.deps:
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch 2.13.0 (CPU build) first, pinned, so nothing pulls another torch.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q "numpy<3" pytest expecttest
	touch $@

$(VENV)/.installed: $(VENV)/.deps setup.py pyproject.toml | system-deps
	$(PIP) install -q --no-build-isolation -e .
	touch $@

# Incremental rebuild of the extension (ninja) after C++ changes.
build: $(VENV)/.installed
	$(PY) setup.py -q build_ext --inplace

demo: build
	$(PY) examples/demo.py

runtime-test: system-deps
	cmake -S csrc/runtime -B build/runtime -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build build/runtime -j $(MAX_JOBS)
	ctest --test-dir build/runtime --output-on-failure

pytest: build
	$(PY) -m pytest -q tests

test: runtime-test pytest

bench: build
	$(PY) benchmarks/run_all.py

clean:
	rm -rf build python/torch_npu/_C*.so python/torch_npu.egg-info

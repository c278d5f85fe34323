# The two commands of the README: `make demo` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# ccache (Debian's package) makes rebuilds of the ATen-heavy units fast.
export PATH := $(if $(wildcard /usr/lib/ccache),/usr/lib/ccache:,)$(PATH)
export MAX_JOBS ?= 2

.PHONY: demo test test-cache build pytest pytest-always-enqueue pytest-defer pytest-protected pytest-profile runtime-test runtime-sanitize bench clean system-deps

# Debian packages: GoogleTest for runtime/ tests, ccache for rebuilds, CMake and
# Ninja for the runtime library (csrc/runtime), which the extension links too.
system-deps:
	@if [ ! -e /usr/include/gtest/gtest.h ] || ! command -v ccache >/dev/null || ! command -v cmake >/dev/null \
	    || ! command -v ninja >/dev/null; then \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && apt-get install -y -qq libgtest-dev ccache cmake ninja-build >/dev/null) || \
	      echo "warning: could not install libgtest-dev/ccache/cmake/ninja-build"; \
	  else echo "warning: install libgtest-dev, ccache, cmake and ninja-build (apt-get) to build and test"; fi; \
	fi

$(VENV)/.deps: Makefile
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch 2.13.0 (CPU build) first, pinned, so nothing pulls another torch.
	$(PIP) install -q torch==2.13.0
	# The rest under a constraint that pins torch, so no dependency can replace it:
	# the doctor's plots (matplotlib) and the tests' checks (jsonschema), the
	# digits data set of examples/cnn_digits.py (scikit-learn), and the libraries
	# whose NPU code paths the tests run (transformers, accelerate).
	echo "torch==2.13.0" > $(VENV)/constraints.txt
	$(PIP) install -q -c $(VENV)/constraints.txt "numpy<3" pytest pytest-xdist expecttest matplotlib jsonschema \
	  scikit-learn transformers accelerate
	touch $@

# Real clients built for the Ascend adapter, whose tests run against the npu. Each is
# optional: one that cannot be installed here is reported, and its tests skip saying so.
# VLLM_ASCEND_GIT may name a local clone or mirror where GitHub cannot be reached.
VLLM_ASCEND_GIT ?= https://github.com/vllm-project/vllm-ascend.git
VLLM_ASCEND_COMMIT := 182b75ea84ff13ece27b57391331ef8935410aea
VLLM_SDIST_URL := https://files.pythonhosted.org/packages/97/fa/a3cb3a7baf9f1f1027580b0542e42f655b0f577b8a8d39878c1c0a73e6a9/vllm-0.27.1.tar.gz
VLLM_SDIST_SHA256 := eec2d54d137ac1e59cb4c39226dfee1943eefc8f4788f5821d7300d6acbdb646

$(VENV)/.clients: $(VENV)/.deps
	DS_BUILD_OPS=0 $(PIP) install -q -c $(VENV)/constraints.txt deepspeed \
	  || echo "note: deepspeed could not be installed; tests/distributed/test_deepspeed.py skips"
	$(PIP) install -q -c $(VENV)/constraints.txt msprof-analyze \
	  || echo "note: msprof-analyze could not be installed; its tests skip"
	$(PIP) install -q -c $(VENV)/constraints.txt mindstudio-probe \
	  || echo "note: mindstudio-probe could not be installed; its tests skip"
	$(PIP) install -q -c $(VENV)/constraints.txt diffusers==0.42.1 \
	  || echo "note: diffusers could not be installed; tests/compat/test_diffusers.py skips"
	$(PIP) install -q -c $(VENV)/constraints.txt trl==1.16.0 \
	  || echo "note: trl could not be installed; tests/compat/test_trl.py skips"
	# vLLM 0.27.1 from its source package as vllm-ascend's CPU CI installs it (VLLM_TARGET_DEVICE=empty:
	# pure Python), its build tools first and without build isolation (which would fetch a CUDA torch).
	# The sdist file itself, checked: pip refuses `vllm==0.27.1` from the index because the empty
	# target's metadata says 0.27.1+empty.
	mkdir -p build && curl -fsSL --retry 2 -o build/vllm-0.27.1.tar.gz $(VLLM_SDIST_URL) \
	  && echo "$(VLLM_SDIST_SHA256)  build/vllm-0.27.1.tar.gz" | sha256sum -c --quiet \
	  && $(PIP) install -q -c $(VENV)/constraints.txt "cmake>=3.26.1" "setuptools-scm>=8" "setuptools-rust>=1.9.0" \
	  && VLLM_TARGET_DEVICE=empty $(PIP) install -q --no-build-isolation -c $(VENV)/constraints.txt \
	    ./build/vllm-0.27.1.tar.gz \
	  || echo "note: vLLM 0.27.1 could not be installed; tests/compat/test_vllm_ascend.py skips"
	# vLLM imports torchvision; only a CPU build loads beside the CPU torch (PyPI's needs CUDA's libraries).
	$(PIP) install --isolated -q --no-deps --retries 1 --timeout 20 --index-url https://download.pytorch.org/whl/cpu \
	    torchvision==0.28.0+cpu \
	  || echo "note: no CPU torchvision 0.28.0 (download.pytorch.org unreachable); test_vllm_ascend.py gives vLLM a stand-in"
	# vllm-ascend at the commit whose CI targets vLLM 0.27.1, its source (with the A2 device tests) in
	# build/vllm-ascend; installed without its dependencies (they pin another torch) and compiled kernels (CANN).
	rm -rf build/vllm-ascend && mkdir -p build/vllm-ascend && git -C build/vllm-ascend init -q \
	  && git -C build/vllm-ascend fetch -q --depth 1 $(VLLM_ASCEND_GIT) $(VLLM_ASCEND_COMMIT) \
	  && git -C build/vllm-ascend checkout -q FETCH_HEAD \
	  && COMPILE_CUSTOM_KERNELS=0 SOC_VERSION=ascend910b2 $(PIP) install -q --no-deps --no-build-isolation \
	    -c $(VENV)/constraints.txt ./build/vllm-ascend \
	  || echo "note: vllm-ascend could not be fetched from $(VLLM_ASCEND_GIT) or installed; test_vllm_ascend.py skips"
	$(PIP) install -q -c $(VENV)/constraints.txt numba \
	  || echo "note: numba (a dependency of vllm-ascend's model runner) could not be installed; its tests fail"
	touch $@

$(VENV)/.installed: $(VENV)/.deps setup.py pyproject.toml | system-deps
	TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(PIP) install -q --no-build-isolation -e .
	touch $@

# Incremental rebuild of the extension (ninja) after C++ changes.
build: $(VENV)/.installed
	TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(PY) setup.py -q build_ext --inplace

# The main job: the doctor runs the transformer example on the npu and reports.
demo: build
	$(PY) -m torch_npu.doctor --html doctor-report.html examples/train_lm.py

runtime-test: system-deps
	cmake -S csrc/runtime -B build/runtime -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build build/runtime -j $(MAX_JOBS)
	ctest --test-dir build/runtime -j $(MAX_JOBS) --output-on-failure

# The tests run on every core (pytest-xdist), one file per worker at a time, so a
# file's fixtures and order stay as written. One inductor cache serves every run of
# `make test` (emptied at its start: code compiled by an earlier build of the
# code generation must not stand in for today's), so a model compiled by one run
# is not compiled again by the next.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/build/test-inductor-cache
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile
# The reruns below repeat tests under one mode of the emulator; tests marked child_process
# set the mode they test in their own interpreters, so a rerun would only repeat them.
MODE_PYTEST := $(PYTEST) -m "not child_process"

test-cache:
	rm -rf $(TORCHINDUCTOR_CACHE_DIR)

pytest: build $(VENV)/.clients
	$(PYTEST) --durations=15 tests

# The stream, copy, random, checkpoint and model tests again with the fully asynchronous
# launch policy (every kernel queued to its stream's worker thread), so ordering
# bugs that running on the caller's thread hides cannot come back.
ALWAYS_ENQUEUE_TESTS := tests/device/test_streams.py tests/device/test_copy.py tests/device/test_random.py tests/models/test_checkpoint.py tests/models/test_models.py \
	tests/device/test_stream_semantics.py tests/memory/test_memory.py tests/models/test_real_models.py tests/device/test_graphs.py tests/ops/test_quantized.py tests/device/test_task_groups.py
pytest-always-enqueue: build
	NPU_EMU_ALWAYS_ENQUEUE=1 $(MODE_PYTEST) $(ALWAYS_ENQUEUE_TESTS)

# The stream, copy and graph tests again with deferred execution (NPU_EMU_DEFER=1): what
# the emulator does while a profiler projects onto a chip (queued work waits for the
# host's next wait, host-run ops are launched as kernels), so that it keeps every
# stream semantic too.
DEFER_TESTS := tests/device/test_streams.py tests/device/test_stream_semantics.py tests/device/test_copy.py tests/device/test_graphs.py
pytest-defer: build
	NPU_EMU_DEFER=1 $(MODE_PYTEST) $(DEFER_TESTS)

# Models, streams, copies, compile, distributed and the doctor again with the
# device's memory closed to the host outside device work (NPU_EMU_PROTECT=1, as
# a discrete device whose memory the host cannot address): a path that reads
# device memory from the host faults instead of working by accident. Tests of
# host timing are left out (the memory gate adds to every op's host time).
PROTECTED_TESTS := tests/models/test_models.py tests/models/test_real_models.py tests/device/test_streams.py tests/device/test_copy.py \
	tests/device/test_stream_semantics.py tests/memory/test_memory.py tests/compile/test_compile.py tests/distributed/test_distributed.py \
	tests/doctor/test_doctor.py tests/models/test_checkpoint.py tests/ops/test_custom_ops.py tests/fused/test_fused_ops.py \
	tests/ops/test_fallback.py tests/ops/test_ops.py tests/ops/test_mixed_arguments.py tests/device/test_contracts.py \
	tests/profiler/test_profiler.py tests/device/test_graphs.py
pytest-protected: build
	NPU_EMU_PROTECT=1 $(PYTEST) -m "not host_timing and not child_process" $(PROTECTED_TESTS)

# The model tests again with the npu as an Ascend 910B2 (NPU_EMU_PROFILE): the
# chip's support set, its numerics and its identity under real models.
PROFILE_TESTS := tests/models/test_models.py tests/models/test_real_models.py
pytest-profile: build
	NPU_EMU_PROFILE=ascend910b2 $(MODE_PYTEST) $(PROFILE_TESTS)

# The runtime's GoogleTest suite under ThreadSanitizer and AddressSanitizer.
runtime-sanitize: system-deps
	for san in thread address; do \
	  cmake -S csrc/runtime -B build/runtime-$$san -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    -DNPU_RUNTIME_SANITIZE=$$san >/dev/null && \
	  cmake --build build/runtime-$$san -j $(MAX_JOBS) && \
	  TSAN_OPTIONS=halt_on_error=1 ASAN_OPTIONS=detect_leaks=1 \
	    ctest --test-dir build/runtime-$$san --output-on-failure || exit 1; \
	done

test: test-cache runtime-test pytest pytest-always-enqueue pytest-defer pytest-protected pytest-profile

bench: build
	$(PY) benchmarks/run_all.py

clean:
	rm -rf build python/torch_npu/_C*.so python/torch_npu.egg-info

"""vllm-ascend's own device tests for the A2 family, run against this torch_npu.

vllm-ascend's unit tests under ``tests/ut/**/a2/`` are the ones its CI runs on an Atlas A2
machine with one NPU. Its test configuration (``tests/ut/conftest.py``) uses the real
torch_npu when ``npu-smi info`` succeeds, and mocks otherwise: here ``npu-smi`` (this
package's command) is first on PATH, so they import this torch_npu, under
``NPU_EMU_PROFILE=ascend910b2``. The models they read get their ``config.json`` from a local,
offline Hugging Face cache this test writes (config files only, no weights).

They run in one pytest process (as vllm-ascend's CI runs them), with a small plugin that
records each test's outcome. The result, passed/total per file with what stops the failing
ones (a torch_npu name that is missing, or something outside this project: vllm-ascend's
compiled kernels that only load with CANN, triton-ascend), is printed and written to
``build/vllm-ascend-a2.md``. The test fails when the process crashes or hangs, or when a file
of EXPECTED_PASS passes fewer tests than listed: the list holds what passes today, so it
cannot regress; a name added to torch_npu that makes more pass belongs in it.

Installed by the Makefile's ``.clients`` target: vLLM 0.27.1 from its source package with
VLLM_TARGET_DEVICE=empty, vllm-ascend (the commit below, whose CI targets vLLM 0.27.1) with
--no-deps and without its compiled kernels, its source (with the tests) in build/vllm-ascend.
"""
import collections
import json
import os
import re
import subprocess
import sys
import textwrap
from importlib.util import find_spec

import pytest

from helpers import REPO_ROOT

pytestmark = pytest.mark.child_process

VLLM_ASCEND_COMMIT = "182b75ea84"   # vllm-project/vllm-ascend, 2026-08-22; .github/vllm-release-tag.commit: v0.27.1
SOURCE = os.environ.get("VLLM_ASCEND_SRC") or os.path.join(REPO_ROOT, "build", "vllm-ascend")
REPORT = os.path.join(REPO_ROOT, "build", "vllm-ascend-a2.md")
TIMEOUT_S = 1800
# The npu's memory for the run: host memory backs it as it is used, and the 910B2's 64 GiB is more
# than a test host has (the precision tests' 4 GiB KV caches, kept by the caching allocator
# across tests, had the host's OOM killer end the run). 6 GiB holds one such cache; a test that
# needs more gets torch.OutOfMemoryError, reported as such.
NPU_MEMORY = "6GiB"
# Files left out of the run unless NPU_VA_ALL=1: every test of them needs more npu memory than
# that cap (0/41 and 0/11 pass, each stopped by torch.OutOfMemoryError), and they took two of the
# harness's three minutes to get there.
NOT_RUN = {
    "tests/ut/attention/a2/test_attention_v1_precision.py": "more npu memory than the run's 6 GiB cap",
    "tests/ut/attention/a2/test_mla_precision.py": "more npu memory than the run's 6 GiB cap",
}

# file (relative to vllm-ascend's root) -> tests of it that pass today; a file passing fewer fails the test.
EXPECTED_PASS = {
    "tests/ut/attention/a2/test_attention_cp.py": 4,
    "tests/ut/attention/a2/test_attention_cp_precision.py": 1,
    "tests/ut/attention/a2/test_attention_v1.py": 32,
    "tests/ut/attention/a2/test_common_cp.py": 10,
    "tests/ut/attention/a2/test_mla_cp.py": 4,
    "tests/ut/attention/a2/test_mla_cp_precision.py": 1,
    "tests/ut/attention/a2/test_mla_v1.py": 70,
    "tests/ut/attention/a2/test_sfa_cp_precision.py": 2,
    "tests/ut/attention/a2/test_sfa_v1.py": 35,
    "tests/ut/compilation/a2/test_acl_graph.py": 24,
    "tests/ut/eplb/core/a2/test_eplb_utils.py": 5,
    "tests/ut/kv_offload/a2/test_remote_decode_lifecycle.py": 2,
    "tests/ut/kv_offload/a2/test_remote_prefill_lifecycle.py": 3,
    "tests/ut/ops/a2/test_gdn_chunk_meta.py": 4,
    "tests/ut/ops/a2/test_gdn_layerwise_kv.py": 1,
    "tests/ut/ops/a2/test_token_dispatcher.py": 17,
    "tests/ut/quantization/methods/a2/test_w4a16.py": 23,
    "tests/ut/quantization/methods/a2/test_w4a4_flatquant.py": 13,
    # 4 of 5: test_apply_with_npu packs a torch.empty int8 weight, which passes only when the host's
    # memory happens to hold int4 values; npu_convert_weight_to_int4pack refuses any other value.
    "tests/ut/quantization/methods/a2/test_w4a4_laos_dynamic.py": 4,
    "tests/ut/quantization/methods/a2/test_w8a16.py": 5,
    "tests/ut/quantization/methods/a2/test_w8a8_dynamic.py": 12,
    "tests/ut/quantization/methods/a2/test_w8a8_static.py": 7,
    "tests/ut/spec_decode/a2/test_eagle_proposer.py": 48,
    "tests/ut/worker/a2/test_block_table.py": 5,
    "tests/ut/worker/a2/test_model_runner_v1.py": 22,
    "tests/ut/worker/a2/test_model_runner_v1_with_device.py": 15,
    "tests/ut/worker/a2/test_worker_v1.py": 2,
}

# The config.json of each model the A2 tests name (the published files' fields the tests and
# vLLM's ModelConfig read; no weights, no tokenizer).
MODELS = {
    "meta-llama/Meta-Llama-3-8B": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
        "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 14336, "max_position_embeddings": 8192, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256,
    },
    "Qwen/Qwen3-8B": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36,
        "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000, "sliding_window": None, "use_sliding_window": False, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "vocab_size": 151936,
    },
    "deepseek-ai/DeepSeek-V2": {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "attention_bias": False,
        "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu",
        "hidden_size": 5120, "intermediate_size": 12288, "kv_lora_rank": 512, "max_position_embeddings": 163840,
        "moe_intermediate_size": 1536, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 160,
        "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 128, "num_experts_per_tok": 6,
        "num_hidden_layers": 60, "num_key_value_heads": 128, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000, "routed_scaling_factor": 16.0,
        "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                         "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096},
        "scoring_func": "softmax", "topk_group": 3, "topk_method": "group_limited_greedy",
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 102400,
    },
    "deepseek-ai/DeepSeek-V3.2-Exp": {
        "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "attention_bias": False,
        "bos_token_id": 0, "eos_token_id": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
        "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048, "intermediate_size": 18432,
        "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
        "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
        "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
        "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [128, 128], "scale_fmt": "ue8m0"},
        "rms_norm_eps": 1e-06, "rope_theta": 10000, "routed_scaling_factor": 2.5,
        "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
        "scoring_func": "sigmoid", "topk_group": 4, "topk_method": "noaux_tc", "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 129280,
    },
}

# Records each test's outcome and the first line of its failure (loaded with -p).
PLUGIN = textwrap.dedent(r'''
    import json, os

    _tests, _collect = {}, {}

    import importlib, re

    def _message(report):
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None:
            message = crash.message
        else:
            lines = [line for line in str(report.longrepr).splitlines() if line.startswith("E   ")]
            message = lines[-1][4:] if lines else str(report.longrepr).strip().splitlines()[-1]
        # mock.patch("pkg.module.name") reports a module that failed to import as a missing attribute
        target = re.search(r"module '((?:vllm_ascend|vllm)[\w.]*)' has no attribute '(\w+)'", message)
        if target:
            try:
                importlib.import_module(f"{target.group(1)}.{target.group(2)}")
            except Exception as error:
                message += f" (importing it: {type(error).__name__}: {error})"
            except BaseException:
                pass
        if "object is not subscriptable" in message and "triton" in str(report.longrepr):
            message += " (a triton kernel launched as kernel[grid]: triton is a placeholder here)"
        return message[:2000]

    def pytest_collectreport(report):
        if report.failed:
            _collect[report.nodeid.split("::")[0]] = _message(report)

    def pytest_runtest_logreport(report):
        test = _tests.setdefault(report.nodeid, {"outcome": "passed", "message": None})
        if report.when == "call" or report.outcome != "passed":
            if test["outcome"] in ("passed", "skipped"):
                outcome = report.outcome if report.when == "call" else ("skipped" if report.skipped else "error")
                test["outcome"] = outcome
                if outcome in ("failed", "error"):
                    test["message"] = _message(report)

    def pytest_sessionfinish(session):
        with open(os.environ["NPU_VA_REPORT"], "w") as f:
            json.dump({"tests": _tests, "collect": _collect}, f)
''')


# vLLM imports torchvision (its Qwen-VL models, through transformers' image processors), and only a
# CPU build of it loads beside the CPU torch. Where none could be installed (the Makefile's note
# says so), the child gets this stand-in: the imports succeed, any use raises. No A2 device test
# processes images.
TORCHVISION_STAND_IN = {
    "__init__.py": '__version__ = "0.28.0"   # the version vLLM 0.27.1 pins\n',
    "transforms/__init__.py": textwrap.dedent('''
        import enum

        class InterpolationMode(enum.Enum):
            NEAREST, NEAREST_EXACT, BILINEAR, BICUBIC = "nearest", "nearest-exact", "bilinear", "bicubic"
            BOX, HAMMING, LANCZOS = "box", "hamming", "lanczos"
        '''),
    "transforms/functional.py": "",
    "transforms/v2/__init__.py": "",
    "transforms/v2/functional.py": "",
}
_UNAVAILABLE = textwrap.dedent('''

    def __getattr__(name):   # every other name: a function that raises when called
        if name.startswith("__"):
            raise AttributeError(name)

        def unavailable(*args, **kwargs):
            raise RuntimeError(f"torchvision is a stand-in here (no CPU build installed): {__name__}.{name}")
        return unavailable
    ''')


def _torchvision_stand_in(directory):
    for path, text in TORCHVISION_STAND_IN.items():
        target = os.path.join(directory, "torchvision", path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w") as f:
            f.write(text + _UNAVAILABLE)


def _missing():
    if find_spec("vllm") is None:
        return "vLLM 0.27.1 is not installed (the Makefile's .clients target installs it; its note says why not)"
    if find_spec("vllm_ascend") is None:
        return "vllm-ascend is not installed (the Makefile's .clients target installs it; its note says why not)"
    if not os.path.isdir(os.path.join(SOURCE, "tests", "ut")):
        return (f"vllm-ascend's source with its tests is not at {SOURCE} (the .clients target puts it there: "
                f"rm .venv/.clients and rerun make)")
    return None


def a2_files(everything=False):
    """vllm-ascend's A2 test files, less NOT_RUN unless `everything`."""
    found = []
    for root, _, files in os.walk(os.path.join(SOURCE, "tests", "ut")):
        if os.path.basename(root) == "a2":
            found += [os.path.relpath(os.path.join(root, f), SOURCE) for f in files
                      if f.startswith("test_") and f.endswith(".py")]
    return sorted(f for f in found if everything or f not in NOT_RUN)


def _hf_cache(home):
    for name, config in MODELS.items():
        repo = os.path.join(home, "hub", "models--" + name.replace("/", "--"))
        snapshot = os.path.join(repo, "snapshots", "0" * 40)
        os.makedirs(snapshot, exist_ok=True)
        os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
        with open(os.path.join(repo, "refs", "main"), "w") as f:
            f.write("0" * 40)
        with open(os.path.join(snapshot, "config.json"), "w") as f:
            json.dump(config, f, indent=1)


MISSING_NAME = re.compile(r"(?:module|object|<module) '?(torch_npu[\w.]*|torch\.npu|torch\.ops\.npu)'?"
                          r"(?: from '[^']*'>)? (?:has no attribute|does not have the attribute) '(\w+)'")
MISSING_MODULE = re.compile(r"No module named '(torch_npu\.[\w.]+)'")
OUTSIDE = [   # (pattern, what it is) for failures that come from outside this project
    (re.compile(r"vllm_ascend_C|_C_ascend|torch\.ops\._C_ascend"), "vllm-ascend's compiled kernels (vllm_ascend_C: CANN)"),
    (re.compile(r"triton", re.I), "triton-ascend"),
    (re.compile(r"No module named '(numba|decorator|quart|pandas|arctic_inference)'"), "a vllm-ascend dependency not installed"),
    (re.compile(r"\bacl\b|libascend|CANN|ascend_toolkit|ASCEND_HOME", re.I), "CANN"),
    (re.compile(r"memfabric|memcache|mooncake|arctic", re.I), "a vllm-ascend dependency outside this project"),
    (re.compile(r"OutOfMemoryError|out of memory", re.I), f"needs more npu memory than the run's NPU_EMU_MEMORY={NPU_MEMORY}"),
]


def blocker(message):
    """What a failure message says stops the test: 'torch_npu: <name>', an outside component, or the message."""
    names = [f"{module}.{name}" for module, name in MISSING_NAME.findall(message)] + MISSING_MODULE.findall(message)
    if names:
        return ", ".join(f"missing {name}" for name in dict.fromkeys(names))
    for pattern, what in OUTSIDE:
        if pattern.search(message):
            return what
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return "no message"
    # pydantic and similar put the reason on the second line ("1 validation error for X" / "Value error, ...")
    return (lines[0] + (" " + lines[1] if len(lines) > 1 and re.search(r"\d+ validation errors? for", lines[0]) else ""))[:240]


def summarise(files, raw, stderr):
    """{file: {"passed", "failed", "error", "skipped", "blockers": Counter}}."""
    rows = {f: {"passed": 0, "failed": 0, "error": 0, "skipped": 0, "blockers": collections.Counter()} for f in files}
    if raw is None:   # the run ended before the session did: a conftest failed to import
        lines = [line[4:] for line in stderr.splitlines() if line.startswith("E   ")]
        message = "vllm-ascend's tests/ut/conftest.py: " + (lines[-1] if lines else stderr.strip()[-300:])
        for row in rows.values():
            row["error"] = 1
            row["blockers"]["conftest: " + blocker(message) if lines else message] += 1
        return rows
    for path, message in raw["collect"].items():
        if path in rows:
            rows[path]["error"] += 1
            rows[path]["blockers"][blocker(message)] += 1
    for nodeid, test in raw["tests"].items():
        row = rows.setdefault(nodeid.split("::")[0], {"passed": 0, "failed": 0, "error": 0, "skipped": 0,
                                                     "blockers": collections.Counter()})
        row[test["outcome"]] += 1
        if test["message"]:
            row["blockers"][blocker(test["message"])] += 1
    return rows


def table(rows, left_out=None):
    lines = ["| file | passed/total | skipped | what stops the rest |", "| --- | --- | --- | --- |"]
    for path in sorted({*rows, *(left_out or {})}):
        if path not in rows:
            lines.append(f"| {path} | not run | | needs {left_out[path]} (NPU_VA_ALL=1 runs it) |")
            continue
        row = rows[path]
        total = row["passed"] + row["failed"] + row["error"]
        stops = "; ".join(f"{what} ({count})" for what, count in row["blockers"].most_common(4))
        lines.append(f"| {path} | {row['passed']}/{total} | {row['skipped']} | {stops} |")
    return "\n".join(lines)


def test_vllm_ascend_a2_device_tests(tmp_path):
    why = _missing()
    if why:
        pytest.skip(why)
    files = a2_files(everything=os.environ.get("NPU_VA_ALL") == "1")
    assert files, f"no tests/ut/**/a2/test_*.py under {SOURCE}"
    bin_dir, plugin_dir, hf_home = tmp_path / "bin", tmp_path / "plugin", tmp_path / "hf"
    bin_dir.mkdir()
    plugin_dir.mkdir()
    (bin_dir / "npu-smi").write_text(f"#!/bin/sh\nexec {sys.executable} -m torch_npu_smi \"$@\"\n")
    (bin_dir / "npu-smi").chmod(0o755)
    (plugin_dir / "npu_va_report.py").write_text(PLUGIN)
    _hf_cache(str(hf_home))
    stand_in = find_spec("torchvision") is None
    if stand_in:
        _torchvision_stand_in(str(plugin_dir))
    report = tmp_path / "report.json"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(plugin_dir), os.environ.get("PYTHONPATH")])),
               NPU_EMU_PROFILE="ascend910b2", NPU_EMU_DEVICES="1", NPU_EMU_MEMORY=NPU_MEMORY,
               NPU_EMU_USAGE_DIR=str(tmp_path / "usage"),
               HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", NPU_VA_REPORT=str(report),
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", PYTEST_ADDOPTS="")
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    assert subprocess.run(["npu-smi", "info"], env=env, capture_output=True).returncode == 0
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "npu_va_report",
           "--continue-on-collection-errors", "--rootdir", SOURCE, *files]
    try:
        proc = subprocess.run(cmd, cwd=SOURCE, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"vllm-ascend's A2 tests hung (over {TIMEOUT_S} s); last output:\n{(expired.stdout or '')[-3000:]}")
    raw = json.loads(report.read_text()) if report.exists() else None
    rows = summarise(files, raw, proc.stdout + proc.stderr)
    note = " (torchvision: a stand-in, no CPU build installed)" if stand_in else ""
    text = table(rows, {path: NOT_RUN[path] for path in a2_files(everything=True) if path not in files})
    passed = sum(row["passed"] for row in rows.values())
    total = sum(row["passed"] + row["failed"] + row["error"] for row in rows.values())
    os.makedirs(os.path.dirname(REPORT), exist_ok=True)
    with open(REPORT, "w") as f:
        f.write(f"vllm-ascend@{VLLM_ASCEND_COMMIT} tests/ut/**/a2 under NPU_EMU_PROFILE=ascend910b2: "
                f"{passed}/{total} passed{note}\n\n{text}\n")
    print(f"\n{passed}/{total} passed{note}\n{text}")
    assert proc.returncode in (0, 1, 2, 4, 5), (
        f"pytest over vllm-ascend's A2 tests crashed (exit status {proc.returncode}):\n{proc.stdout[-3000:]}\n"
        f"{proc.stderr[-3000:]}")
    regressed = {path: (rows[path]["passed"], count) for path, count in EXPECTED_PASS.items()
                 if rows.get(path, {"passed": 0})["passed"] < count}
    assert not regressed, f"fewer tests pass than listed in EXPECTED_PASS (passed, listed): {regressed}\n{text}"


def test_blocker_names_what_stops_a_test():
    assert blocker("AttributeError: module 'torch_npu' has no attribute 'float4_e2m1fn_x2'") == \
        "missing torch_npu.float4_e2m1fn_x2"
    assert blocker("AttributeError: <module 'torch_npu' from '/x/torch_npu/__init__.py'> does not have the "
                   "attribute 'npu_weight_quant_batchmatmul'") == "missing torch_npu.npu_weight_quant_batchmatmul"
    assert blocker("AttributeError: module 'torch_npu.npu' has no attribute 'graph_task_update_begin'") == \
        "missing torch_npu.npu.graph_task_update_begin"
    assert blocker("ModuleNotFoundError: No module named 'vllm_ascend.vllm_ascend_C'") == \
        "vllm-ascend's compiled kernels (vllm_ascend_C: CANN)"
    assert blocker("RuntimeError: '_C_ascend::npu_lightning_indexer' not found") == \
        "vllm-ascend's compiled kernels (vllm_ascend_C: CANN)"
    assert blocker("AttributeError: module 'vllm_ascend.worker' has no attribute 'worker' (importing it: "
                   "ModuleNotFoundError: No module named 'torch_npu.op_plugin')") == "missing torch_npu.op_plugin"
    assert blocker("TypeError: 'function' object is not subscriptable (a triton kernel launched as kernel[grid]: "
                   "triton is a placeholder here)") == "triton-ascend"
    assert blocker("ValueError: shapes differ") == "ValueError: shapes differ"
    assert blocker("ValidationError: 1 validation error for ModelConfig\n  Value error, no config") == \
        "ValidationError: 1 validation error for ModelConfig Value error, no config"

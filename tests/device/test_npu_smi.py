"""The npu-smi command: the emulated devices in Ascend's table, with the memory that running
torch_npu processes reserve (published by the caching allocator, csrc/core/usage_board.h).

Each test gives its processes a usage directory of its own (NPU_EMU_USAGE_DIR), so other
test processes on the machine do not show up in its tables. The forms are parsed with the
expressions and field positions the clients use (vllm-ascend's setup.py and benchmark
script, MindSpeed, MindSpeed-LLM's version script, msprobe's build script).
"""
import os
import re
import subprocess
import sys

import pytest

from helpers import REPO_ROOT

pytestmark = pytest.mark.child_process

CHILD = r"""
import sys, torch, torch_npu
mib, device = int(sys.argv[1]), sys.argv[2]
x = torch.empty(mib << 20, dtype=torch.uint8, device=device)
print("ready", flush=True)
sys.stdin.readline()      # hold the memory until told
del x
torch.npu.empty_cache()   # reserved memory back to 0: published at once
print("freed", flush=True)
sys.stdin.readline()
"""


def _env(tmp_path, **extra):
    env = dict(os.environ, NPU_EMU_USAGE_DIR=str(tmp_path / "usage"))
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    env.pop("TORCH_NPU_EMU_DEVICES_BEFORE_MASK", None)
    env.update({key: str(value) for key, value in extra.items()})
    return env


def smi(env, *args, check=True):
    proc = subprocess.run([sys.executable, "-m", "torch_npu_smi", *args], env=env, capture_output=True, text=True,
                          timeout=60)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


class Child:
    """A torch_npu process that reserves `mib` MiB on `device` until closed."""

    def __init__(self, env, mib, device="npu:0"):
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, str(mib), device], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.expect("ready")

    def expect(self, word):
        line = self.proc.stdout.readline().strip()
        assert line == word, f"child said {line!r}; stderr:\n{self.proc.stderr.read() if not line else ''}"

    def step(self, word):
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        self.expect(word)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def process_rows(table):
    """(npu, chip, pid, name, MB) of each process row of `npu-smi info`."""
    rows = re.findall(r"^\| (\d+)\s+(\d+)\s+\| (\d+)\s+\| (\S+)\s+\| (\d+)\s+\|$", table, re.M)
    return [(int(n), int(c), int(p), name, int(mb)) for n, c, p, name, mb in rows]


def hbm_usage(table):
    """{npu: (used MB, total MB)} from the second line of each device's rows."""
    devices = re.findall(r"^\| (\d+)\s+\S+\s+\| OK", table, re.M)
    usage = re.findall(r"^\| \d+\s+\| [0-9A-F:.]+\s+\| \d+\s+\d+\s*/ \d+\s+(\d+)\s*/ (\d+)\s+\|$", table, re.M)
    return {int(npu): (int(used), int(total)) for npu, (used, total) in zip(devices, usage)}


def test_info_shows_a_process_and_its_memory(tmp_path):
    env = _env(tmp_path, NPU_EMU_DEVICES=2, NPU_EMU_PROFILE="ascend910b2")
    child = Child(env, 64)
    try:
        table = smi(env, "info").stdout
        rows = process_rows(table)
        assert rows == [(0, 0, child.proc.pid, "python", 64)], table
        assert hbm_usage(table) == {0: (64, 65536), 1: (0, 65536)}, table
        assert "No running processes found in NPU 1" in table
        child.step("freed")   # the allocator publishes the release at once
        assert process_rows(smi(env, "info").stdout) == [(0, 0, child.proc.pid, "python", 0)]
    finally:
        child.close()
    table = smi(env, "info").stdout   # its file went with it
    assert process_rows(table) == [] and "No running processes found in NPU 0" in table
    assert os.listdir(tmp_path / "usage") == []


def test_processes_add_up_and_the_mask_names_the_physical_device(tmp_path):
    env = _env(tmp_path, NPU_EMU_DEVICES=4)
    a = Child(env, 32)
    b = Child(dict(env, ASCEND_RT_VISIBLE_DEVICES="2,3"), 40, "npu:1")   # physical npu 3
    c = Child(env, 8, "npu:3")   # a small request: a 20 MiB segment is what is reserved
    try:
        table = smi(env, "info").stdout
        rows = sorted(process_rows(table))
        assert rows == [(0, 0, a.proc.pid, "python", 32), (3, 0, b.proc.pid, "python", 40),
                        (3, 0, c.proc.pid, "python", 20)], table
        assert hbm_usage(table)[3] == (60, 4096)
        usages = smi(env, "info", "-t", "usages", "-i", "3").stdout
        assert re.search(r"HBM Capacity\(MB\)\s+: 4096$", usages, re.M)
        assert re.search(r"HBM Usage Rate\(%\)\s+: 1$", usages, re.M)   # 60 of 4096 MB
    finally:
        for child in (a, b, c):
            child.close()


def test_a_dead_process_file_is_ignored_and_removed(tmp_path):
    env = _env(tmp_path)
    usage = tmp_path / "usage"
    usage.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(gone.stdout)
    (usage / str(pid)).write_text(f"torch_npu usage 1\npid {pid}\nstart 1\nname python\nnpu 0 1048576\nend\n")
    # a live pid whose start time differs: the pid was reused by another process
    (usage / str(os.getpid())).write_text(f"torch_npu usage 1\npid {os.getpid()}\nstart 1\nname old\nnpu 0 1048576\nend\n")
    table = smi(env, "info").stdout
    assert process_rows(table) == [] and "No running processes found in NPU 0" in table
    assert sorted(os.listdir(usage)) == []


def test_the_forms_clients_parse(tmp_path):
    env = _env(tmp_path, NPU_EMU_DEVICES=8, NPU_EMU_PROFILE="ascend910b4")
    table = smi(env, "info").stdout
    lines = table.splitlines()
    assert all(len(line) == 98 for line in lines)
    # MindSpeed-LLM's version script: line 2 field 3 (the HDK version), line 7 field 3 (the name)
    assert re.fullmatch(r"\d+\.\d+\.\d+", lines[1].split()[2])
    assert "Ascend " + lines[6].split()[2] == "Ascend 910B4"
    # vllm-ascend's benchmark script: the Name column of the device rows
    names = [line.split("|")[1].split()[1] for line in lines if re.match(r"^\| [0-9]+", line)
             and len(line.split("|")[1].split()) == 2]
    assert names == ["910B4"] * 8
    # other parsers: whitespace fields 2 (name) and 4 (health) of a device row
    assert lines[6].split()[2] == "910B4" and lines[6].split()[4] == "OK"
    # msprobe's build script
    assert re.search("910B|910", table)

    listing = smi(env, "info", "-l").stdout
    assert re.search(r"Total Count\s+: 8$", listing, re.M)
    first = next(line for line in listing.splitlines() if "NPU ID" in line)
    assert int(first.split(":")[-1]) == 0
    assert smi(env, "info", "-t", "board", "-i", "7").returncode == 0
    mapping = smi(env, "info", "-m").stdout
    assert re.search(r"^7\s+0\s+7\s+Ascend 910B4\s*$", mapping, re.M)
    # MindSpeed's qos: the chip's name line
    chip = smi(env, "info", "-t", "board", "-i", "0", "-c", "0").stdout
    assert [line for line in chip.splitlines() if "Chip" in line and "Name" in line] == \
        ["        Chip Name                      : 910B4"]


def _soc_version(env):
    """vllm-ascend's setup.py get_chip_type(), step by step over the forms it reads."""
    def field(text, key):
        for line in text.splitlines():
            if line.strip().startswith(key):
                return line.split(":", 1)[1].strip()
        return None

    listing = smi(env, "info", "-l").stdout
    npu_id = int(next(line for line in listing.splitlines() if "NPU ID" in line).split(":")[-1].strip())
    board = smi(env, "info", "-t", "board", "-i", str(npu_id)).stdout
    if field(board, "Chip Name") is None:   # A2/A3: the chip's form has it
        board = smi(env, "info", "-t", "board", "-i", str(npu_id), "-c", "0").stdout
    name, chip_type, npu_name = field(board, "Chip Name"), field(board, "Chip Type"), field(board, "NPU Name")
    if "310" in name:
        return (chip_type + name).lower()
    if "910" in name:
        if chip_type:
            assert npu_name is None
            return (chip_type + name).lower()
        return (name + "_" + npu_name).lower()
    raise AssertionError(f"unrecognised chip {name}")


@pytest.mark.parametrize("profile", ["ascend910b2", "ascend910b4", "ascend910_9391", "ascend310p3"])
def test_vllm_ascend_reads_the_profile_chip(tmp_path, profile):
    assert _soc_version(_env(tmp_path, NPU_EMU_PROFILE=profile)) == profile


def test_a3_cards_hold_two_chips(tmp_path):
    env = _env(tmp_path, NPU_EMU_DEVICES=4, NPU_EMU_PROFILE="ascend910_9391")
    child = Child(env, 16, "npu:3")   # card 1, chip 1
    try:
        table = smi(env, "info").stdout
        assert re.search(r"^\| 1     Ascend910\s+\| OK", table, re.M)
        assert process_rows(table) == [(1, 1, child.proc.pid, "python", 16)]
        assert re.search(r"Total Count\s+: 2$", smi(env, "info", "-l").stdout, re.M)
    finally:
        child.close()


@pytest.mark.parametrize("args", [["info", "-t", "nosuch", "-i", "0"], ["info", "-x"], ["info", "-t", "board"],
                                  ["info", "-t", "board", "-i", "5"], ["info", "-t", "board", "-i", "0", "-c", "1"],
                                  ["set", "-t", "reset"]])
def test_unknown_forms_fail_with_usage(tmp_path, args):
    proc = smi(_env(tmp_path), *args, check=False)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.startswith("Error: ") and "Usage: npu-smi info" in proc.stderr


def test_help_and_the_installed_command(tmp_path):
    assert smi(_env(tmp_path), "info", "-h").stdout.startswith("Usage: npu-smi info")
    with open(os.path.join(REPO_ROOT, "pyproject.toml")) as f:
        assert 'npu-smi = "torch_npu_smi:main"' in f.read()
    script = os.path.join(os.path.dirname(sys.executable), "npu-smi")
    if not os.path.exists(script):
        pytest.skip("the environment was not reinstalled since npu-smi was added (make build reinstalls it)")
    proc = subprocess.run([script, "info"], env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "npu-smi" in proc.stdout.splitlines()[1]


def test_the_command_imports_no_torch(tmp_path):
    code = "import sys, torch_npu_smi; torch_npu_smi.run(['info']); print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr

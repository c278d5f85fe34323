"""``npu-smi``: the emulated npu's devices, as Ascend's management tool prints them.

Installed with torch_npu as the ``npu-smi`` command. It prints the forms libraries parse
(``npu-smi info``, ``info -l``, ``info -m``, ``info -t board -i N [-c C]``, ``info -t usages``,
``info -t common``) in the real tool's layout: the devices of the environment's emulator
(``NPU_EMU_DEVICES``, the chip of ``NPU_EMU_PROFILE``, the memory of ``NPU_EMU_MEMORY``), and
the memory each running torch_npu process reserves on each of them, which the caching
allocator publishes (csrc/core/usage_board.h: one small file per process in the usage
directory). Power and temperature are fixed figures (the emulator has no sensors); the
header says the table is emulated.

This package imports neither torch nor torch_npu, so the command answers at once: it reads
the profile files of torch_npu's package directly.
"""
import importlib.util
import os
import sys
import tomllib

VERSION = "24.1.0"   # the driver (HDK) version the header reports: the 24.1 driver's layout is printed
MIB = 1 << 20
POWER_W, TEMP_C = "90.0", "40"   # fixed figures: the emulator has no sensors
USAGE = """Usage: npu-smi info <-h|-m|-l|-t type> [Options...]

Commands:
       -h, --help     Show this help text and exit
       -m             Show all device's mapping information
       -l             Show all device's topology information
       -t type        Show information for type
                      type: board, usages, common (the emulated npu has no other types)

Options:
       -i %d          Card ID
       -c %d          Chip ID
"""


class CommandError(Exception):
    """A form the tool does not know, or a card or chip that does not exist."""


# ---- the emulated devices ------------------------------------------------------------------

def _profiles_dir():
    spec = importlib.util.find_spec("torch_npu")   # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise CommandError("torch_npu is not installed: no npu to show")
    return os.path.join(list(spec.submodule_search_locations)[0], "profiles")


def _bytes(text, what):
    """A size as the emulator reads it (csrc/emu/config.cpp parseBytes): 4GiB, 512MiB, 1g, bytes."""
    text = text.strip()
    digits = len(text) - len(text.lstrip("0123456789."))
    unit = text[digits:].replace(" ", "").lower()
    scales = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
              "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
    try:
        return int(float(text[:digits]) * scales[unit])
    except (KeyError, ValueError):
        raise CommandError(f"{what}={text!r} is not a size; use e.g. 4GiB, 512MiB or a byte count") from None


class Chip:
    """What the table shows of the active profile's chip."""

    def __init__(self, environ):
        name = environ.get("NPU_EMU_PROFILE") or "generic"
        path = os.path.join(_profiles_dir(), name + ".toml")
        if not os.path.isfile(path):
            raise CommandError(f"NPU_EMU_PROFILE={name!r} names no torch_npu device profile")
        with open(path, "rb") as f:
            data = tomllib.load(f)
        identity = data.get("identity", {})
        self.profile = name
        self.family = identity.get("family")
        device_name = identity.get("device_name", "Emulated NPU")
        chip = device_name[len("Ascend"):] if device_name.startswith("Ascend") else device_name.replace(" ", "")
        self.npu_name = None
        if self.family == "A3":   # "Ascend910_9391": chip Ascend910, NPU name 9391, two chips per card
            self.chip_name, self.npu_name = "Ascend910", chip.split("_", 1)[-1]
            self.chips_per_card = 2
        else:
            self.chip_name, self.chips_per_card = chip, 1
        self.chip_type = "Ascend" if identity.get("soc_version") is not None else "Emulated"
        total = data.get("properties", {}).get("total_memory", 0)
        memory = environ.get("NPU_EMU_MEMORY")
        if memory:
            cap = _bytes(memory, "NPU_EMU_MEMORY")
            total = min(total, cap) if total else cap
        self.total_bytes = total or (4 << 30)
        self.ddr = self.family == "310P"   # the 310P's memory is DDR; the others' HBM
        devices = environ.get("TORCH_NPU_EMU_DEVICES_BEFORE_MASK") or environ.get("NPU_EMU_DEVICES") or "1"
        if not devices.strip().isdigit() or int(devices) < 1:
            raise CommandError(f"NPU_EMU_DEVICES={devices!r} is not a device count")
        self.devices = int(devices)

    def cards(self):
        """(card id, [(chip id, device id)]) for each card."""
        per = self.chips_per_card
        return [(card, [(c, card * per + c) for c in range(per) if card * per + c < self.devices])
                for card in range((self.devices + per - 1) // per)]

    def chips_of(self, card):
        """[(chip id, device id)] of the card; CommandError naming the cards if there is none."""
        chips = dict(self.cards()).get(card)
        if chips is None:
            raise CommandError(f"Card ID {card} does not exist: the emulator has card(s) 0 to {len(self.cards()) - 1} "
                               f"(NPU_EMU_DEVICES={self.devices})")
        return chips

    def device(self, card, chip):
        chips = self.chips_of(card)
        for chip_id, device in chips:
            if chip_id == chip:
                return device
        raise CommandError(f"Chip ID {chip} does not exist on card {card}: it has chip(s) "
                           f"{', '.join(str(i) for i, _ in chips)}")


def bus_id(device):
    return f"0000:{(0x01 + 0x20 * device) % 0x100:02X}:00.0"


# ---- the processes (what csrc/core/usage_board.cpp publishes) -------------------------------

def usage_dir(environ=os.environ):
    given = environ.get("NPU_EMU_USAGE_DIR")
    if given:
        return given
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else "/tmp"
    return os.path.join(base, f"torch_npu-{os.getuid()}")


def _start_time(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]   # field 22


def _read_record(path):
    """The record of one process: {"pid", "start", "name", "npu": {device: bytes}}; None if torn."""
    try:
        with open(path) as f:
            lines = f.read().split("\n")
    except OSError:
        return None
    if not lines or lines[0] != "torch_npu usage 1":
        return None
    record = {"npu": {}}
    for line in lines[1:]:
        if line == "end":
            return record
        key, _, value = line.partition(" ")
        if key == "npu":
            device, _, size = value.partition(" ")
            record["npu"][int(device)] = int(size)
        elif key in ("pid", "start", "name"):
            record[key] = value
    return None


def processes(environ=os.environ):
    """The live torch_npu processes: [(pid, name, {device: reserved bytes})]; stale files
    (a dead pid, or a pid reused by another process) are ignored and removed."""
    directory = usage_dir(environ)
    try:
        names = sorted(os.listdir(directory), key=lambda n: int(n) if n.isdigit() else -1)
    except OSError:
        return []
    found = []
    for name in names:
        if not name.isdigit():
            continue
        path = os.path.join(directory, name)
        for _ in range(3):   # a record being rewritten reads without its "end": read again
            record = _read_record(path)
            if record is not None:
                break
        if record is None or record.get("pid") != name:
            continue
        if _start_time(name) != record.get("start"):
            try:
                os.unlink(path)   # the process is gone
            except OSError:
                pass
            continue
        found.append((int(name), record.get("name", "unknown"), record["npu"]))
    return found


# ---- the forms ---------------------------------------------------------------------------

WIDTH = 98
BORDER = "+" + "-" * 27 + "+" + "-" * 15 + "+" + "-" * 52 + "+"
DOUBLE = "+" + "=" * 27 + "+" + "=" * 15 + "+" + "=" * 52 + "+"


def _mb(size):
    return (size + MIB - 1) // MIB


def _row(first, second, third):
    return f"|{first:<27}|{second:<15}|{third:<52}|"


def _full(text):
    return f"| {text}".ljust(WIDTH - 1) + "|"


def info(chip, procs):
    used = {}
    for _, _, devices in procs:
        for device, size in devices.items():
            used[device] = used.get(device, 0) + size
    total = _mb(chip.total_bytes)
    lines = ["+" + "-" * (WIDTH - 2) + "+",
             _full(f"{'npu-smi ' + VERSION:<33}{'Version: ' + VERSION:<24}(emulated: torch_npu)"),
             BORDER]
    lines.append(_row(" NPU   Name", " Health", " Power(W)    Temp(C)           Hugepages-Usage(page)"))
    second_head = " Chip    Device" if chip.ddr else " Chip  Phy-ID" if chip.chips_per_card > 1 else " Chip"
    lines.append(_row(second_head, " Bus-Id", " AICore(%)   Memory-Usage(MB)" + ("" if chip.ddr else "  HBM-Usage(MB)")))
    lines.append(DOUBLE)
    for card, chips in chip.cards():
        for position, (chip_id, device) in enumerate(chips):
            if position > 0:   # A3: each chip of a card has its rows, under a line
                lines.append("+" + "-" * (WIDTH - 2) + "+")
            lines.append(_row(f" {card:<6}{chip.chip_name:<20}", " OK",
                              f" {POWER_W:<12}{TEMP_C:<18}{'0':<5}/ {'0':<14}"))
            mb = _mb(used.get(device, 0))
            if chip.ddr:
                first, memory = f" {chip_id:<8}{device:<18}", f"{mb:<5}/ {total:<14}"
            elif chip.chips_per_card > 1:
                first, memory = f" {chip_id:<6}{device:<20}", f"{'0':<5}/ {'0':<11}{mb:<5}/ {total:<14}"
            else:
                first, memory = f" {chip_id:<26}", f"{'0':<5}/ {'0':<11}{mb:<5}/ {total:<14}"
            lines.append(_row(first, f" {bus_id(device):<14}", f" {'0':<12}{memory}"))
        lines.append(DOUBLE)
    lines.append(BORDER)
    lines.append("|" + f" {'NPU     Chip':<26}" + "|" + f" {'Process id':<14}" + "|"
                 + f" {'Process name':<25}| {'Process memory(MB)':<24}" + "|")
    lines.append(DOUBLE)
    for card, chips in chip.cards():
        rows = []
        for chip_id, device in chips:
            for pid, name, devices in procs:
                if device in devices:
                    rows.append(f"| {card:<8}{chip_id:<18}| {pid:<14}| {name[:24]:<25}| {_mb(devices[device]):<24}|")
        lines.extend(rows or [_full(f"No running processes found in NPU {card}")])
        lines.append(DOUBLE)
    return "\n".join(lines)


def _fields(pairs):
    out = []
    for key, value in pairs:
        out.append("" if key is None else f"        {key:<31}: {value}")
    return "\n".join(out)


def info_list(chip):
    pairs = [("Total Count", len(chip.cards())), (None, None)]
    for card, chips in chip.cards():
        pairs += [("NPU ID", card), ("Chip Count", len(chips)), (None, None)]
    return _fields(pairs)


def info_mapping(chip):
    lines = [f"{'NPU ID':<16}{'Chip ID':<16}{'Chip Logic ID':<16}Chip Name"]
    for card, chips in chip.cards():
        for chip_id, device in chips:
            name = f"Ascend {chip.chip_name}" if chip.chip_type == "Ascend" else chip.chip_name
            lines.append(f"{card:<16}{chip_id:<16}{device:<16}{name:<16}".rstrip())
        lines.append(f"{card:<16}{len(chips):<16}{'-':<16}Mcu")
    return "\n".join(lines)


def board(chip, card, chip_id):
    if chip_id is None:   # the card: no Chip Name (Ascend's two-stage probe relies on that)
        chips = chip.chips_of(card)
        return _fields([
            ("NPU ID", card), ("Product Name", "torch_npu emulated NPU"), ("Model", "NA"),
            ("Manufacturer", "torch_npu (emulated)"), ("Serial Number", f"EMU{card:08d}"),
            ("Software Version", VERSION), ("Firmware Version", "7.5.0.1.220"), ("Compatibility", "OK"),
            ("Board ID", "0x02"), ("PCB ID", "NA"), ("BOM ID", "1"), ("PCIe Bus Info", bus_id(chips[0][1])),
            ("Slot ID", card), ("Class ID", "NA"), ("PCI Vendor ID", "0x19E5"), ("PCI Device ID", "0xD802"),
            ("Subsystem Vendor ID", "0x0200"), ("Subsystem Device ID", "0x3005"), ("Chip Count", len(chips))])
    device = chip.device(card, chip_id)
    pairs = [("NPU ID", card)]
    if chip.npu_name is not None:   # A3: the NPU name, no Chip Type
        pairs += [("NPU Name", chip.npu_name), ("Chip ID", chip_id), ("Chip Name", chip.chip_name)]
    else:
        pairs += [("Chip ID", chip_id), ("Chip Type", chip.chip_type), ("Chip Name", chip.chip_name)]
    pairs += [("Chip Version", "V1"), ("Board ID", "0x02"), ("PCB ID", "NA"), ("BOM ID", "1"),
              ("VDie ID", "NA"), ("NDie ID", "NA"), ("Chip Position ID", chip_id),
              ("PCIe Bus Info", bus_id(device)), ("Firmware Version", "7.5.0.1.220")]
    return _fields(pairs)


def _percent(used, total):
    return (200 * used + total) // (2 * total) if total else 0


def usages(chip, procs, card, chip_id):
    rows = []
    chips = chip.chips_of(card) if chip_id is None else [(chip_id, chip.device(card, chip_id))]
    header = [("NPU ID", card), ("Chip Count", len(chip.chips_of(card))), (None, None)]
    for c, device in chips:
        used = sum(devices.get(device, 0) for _, _, devices in procs)
        memory = "DDR" if chip.ddr else "HBM"
        ddr_total = _mb(chip.total_bytes) if chip.ddr else 0
        rows += [("DDR Capacity(MB)", ddr_total), ("DDR Usage Rate(%)", _percent(used, chip.total_bytes) if chip.ddr else 0),
                 ("DDR Hugepages Total(page)", 0), ("DDR Hugepages Usage Rate(%)", 0)]
        if memory == "HBM":
            rows += [("HBM Capacity(MB)", _mb(chip.total_bytes)), ("HBM Usage Rate(%)", _percent(used, chip.total_bytes))]
        rows += [("Aicore Usage Rate(%)", 0), ("Aivector Usage Rate(%)", 0), ("Aicpu Usage Rate(%)", 0),
                 ("Ctrlcpu Usage Rate(%)", 0), ("DDR Bandwidth Usage Rate(%)", 0)]
        if memory == "HBM":
            rows.append(("HBM Bandwidth Usage Rate(%)", 0))
        rows += [("Chip ID", c), (None, None)]
    return _fields(header + rows[:-1])


def common(chip, procs, card, chip_id):
    chips = chip.chips_of(card) if chip_id is None else [(chip_id, chip.device(card, chip_id))]
    pairs = [("NPU ID", card), ("Chip Count", len(chip.chips_of(card))), (None, None)]
    for c, device in chips:
        used = sum(devices.get(device, 0) for _, _, devices in procs)
        pairs += [("Chip ID", c), ("Memory Usage Rate(%)", _percent(used, chip.total_bytes) if chip.ddr else 0),
                  ("HBM Usage Rate(%)", 0 if chip.ddr else _percent(used, chip.total_bytes)),
                  ("Aicore Usage Rate(%)", 0), ("Temperature(C)", TEMP_C), ("NPU Real-time Power(W)", POWER_W),
                  (None, None)]
    return _fields(pairs[:-1])


def _int_option(args, flag):
    if flag not in args:
        return None
    at = args.index(flag)
    if at + 1 >= len(args) or not args[at + 1].isdigit():
        raise CommandError(f"{flag} needs a number")
    value = int(args[at + 1])
    del args[at:at + 2]
    return value


def run(argv, environ=os.environ):
    """The output of ``npu-smi argv...``; CommandError for a form it does not know."""
    if not argv or argv[0] != "info":
        raise CommandError("npu-smi: the emulated npu answers 'info' only")
    args = list(argv[1:])
    if args in (["-h"], ["--help"]):
        return USAGE.rstrip("\n")
    chip = Chip(environ)
    if not args:
        return info(chip, processes(environ))
    if args == ["-l"]:
        return info_list(chip)
    if args == ["-m"]:
        return info_mapping(chip)
    kind = None
    if "-t" in args:
        at = args.index("-t")
        if at + 1 >= len(args):
            raise CommandError("-t needs a type")
        kind = args[at + 1]
        del args[at:at + 2]
    card, chip_id = _int_option(args, "-i"), _int_option(args, "-c")
    if args or kind is None:
        raise CommandError(f"unknown option(s) {' '.join(args) or 'without -t'}")
    if card is None:
        raise CommandError(f"-t {kind} needs -i <card id>")
    if kind == "board":
        chip.chips_of(card)
        return board(chip, card, chip_id)
    if kind == "usages":
        return usages(chip, processes(environ), card, chip_id)
    if kind == "common":
        return common(chip, processes(environ), card, chip_id)
    raise CommandError(f"type {kind!r} is not emulated (the emulated npu answers board, usages and common)")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        print(run(argv))
        sys.stdout.flush()
    except BrokenPipeError:   # `npu-smi info | head`: the reader had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except CommandError as error:
        print(f"Error: {error}\n\n{USAGE}", file=sys.stderr, end="")
        return 1
    return 0

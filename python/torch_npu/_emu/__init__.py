"""The emulated NPU's Python side: ``profiles`` reads the chip profiles
(``torch_npu/profiles/*.toml``, ``*.tsv``) and hands them to C++ (csrc/core/profile.h).

Nothing is imported here, so that ``torch_npu._emu.profiles`` loads alone.
"""

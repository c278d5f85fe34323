"""Builds torch_npu._C against the installed torch (use --no-build-isolation).

csrc/runtime and csrc/emu (the HAL and the emulated NPU: plain C++17, no torch) are built by
its own CMake file into a static, position-independent library, the one its
GoogleTest suite tests (same sources, same flags; build/runtime-ext, tests
off), and linked into the extension. The rest of csrc is compiled here.
"""
import glob
import os
import re
import shutil
import subprocess

import torch
import torch.utils.cpp_extension as cpp_extension

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
RUNTIME_SOURCE_DIR = os.path.join(ROOT, "csrc", "runtime")
EMULATOR_SOURCE_DIR = os.path.join(ROOT, "csrc", "emu")  # built into the runtime library with it
RUNTIME_BUILD_DIR = os.path.join(ROOT, "build", "runtime-ext")
RUNTIME_LIBRARY = os.path.join(RUNTIME_BUILD_DIR, "libnpu_runtime.a")

SOURCES = sorted(
    os.path.relpath(path, ROOT)
    for path in glob.glob(os.path.join(ROOT, "csrc", "**", "*.cpp"), recursive=True)
    if all(os.path.commonpath([path, d]) != d for d in (RUNTIME_SOURCE_DIR, EMULATOR_SOURCE_DIR))
)


def build_runtime():
    """Configures (cheap when nothing changed) and builds libnpu_runtime.a, incrementally."""
    # Release: the flags of `make runtime-test` (the library's own -O2 -Wall -Wextra,
    # hidden visibility, PIC). The one addition is torch's libstdc++ ABI, which must
    # match across the link (the compiler's default for a torch built with the new ABI).
    cmake = shutil.which("cmake")
    if cmake is None:
        raise SystemExit("torch_npu: building the runtime library (csrc/runtime) needs CMake: install it "
                         "(apt-get install cmake, or pip install cmake) and build again; `make demo` does it")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    configure = [cmake, "-S", RUNTIME_SOURCE_DIR, "-B", RUNTIME_BUILD_DIR, "-DCMAKE_BUILD_TYPE=Release",
                 "-DNPU_RUNTIME_TESTS=OFF", f"-DCMAKE_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    generator = _configured_generator()
    if generator is None and cpp_extension.is_ninja_available():  # BuildExtension needs it too
        generator = "Ninja"
    if generator is not None:  # a build folder keeps the generator it was configured with
        configure += ["-G", generator]
    subprocess.check_call(configure, stdout=subprocess.DEVNULL)
    subprocess.check_call([cmake, "--build", RUNTIME_BUILD_DIR, "-j", os.environ.get("MAX_JOBS", "2")])


def _configured_generator():
    """The generator build/runtime-ext was configured with, if it was."""
    try:
        with open(os.path.join(RUNTIME_BUILD_DIR, "CMakeCache.txt")) as cache:
            found = re.search(r"^CMAKE_GENERATOR:INTERNAL=(.*)$", cache.read(), re.MULTILINE)
    except OSError:
        return None
    return found.group(1) if found else None


class BuildExtensionWithRuntime(BuildExtension.with_options(use_ninja=True)):
    def run(self):
        build_runtime()  # first: the extension depends on the library (relinked when it changes)
        super().run()


setup(
    ext_modules=[
        CppExtension(
            "torch_npu._C",
            SOURCES,
            # -g0: no debug info, it doubles compile and link time of ATen-heavy units;
            # C++20 as torch 2.13 itself (csrc/runtime stays plain C++17, see its CMakeLists);
            # -fopenmp: at::parallel_for is inline and runs serially without it (torch's
            # wheel ships the libgomp.so.1 our module then shares); -fno-trapping-math lets
            # the fused kernels' `omp simd` loops vectorise compares as vector selects.
            # USE_KINETO and Kineto's own include folder: the profiler (csrc/profiler)
            # implements Kineto's IActivityProfiler, whose torch header includes it bare.
            extra_compile_args={"cxx": ["-O2", "-g0", "-std=c++20", "-fvisibility=hidden", "-fopenmp",
                                        "-fno-trapping-math", "-DUSE_KINETO"]},
            include_dirs=[os.path.join(path, "kineto") for path in cpp_extension.include_paths()[:1]],
            extra_objects=[RUNTIME_LIBRARY],
            depends=[RUNTIME_LIBRARY],
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExtensionWithRuntime},
)

"""Builds torch_npu._C against the installed torch (use --no-build-isolation)."""
import glob
import os

import torch.utils.cpp_extension as cpp_extension

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
SOURCES = sorted(
    os.path.relpath(path, ROOT)
    for path in glob.glob(os.path.join(ROOT, "csrc", "**", "*.cpp"), recursive=True)
)

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
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)

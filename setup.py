"""Builds dsa._dsa with the project's CMake (python/CMakeLists.txt) for `pip install .`."""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = Path(self.build_temp).resolve() / "cmake"
        build.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build),
            "-DCMAKE_BUILD_TYPE=Release", "-DDSA_BUILD_PYTHON=ON", "-DDSA_BUILD_TESTS=OFF",
            "-DDSA_BUILD_BENCH=OFF", "-DDSA_BUILD_TOOLS=OFF", "-DPython_EXECUTABLE=" + sys.executable,
            "-DDSA_NCCL=OFF",  # the module binds no dist.h API: keep the wheel free of libnccl
        ] + shlex.split(os.environ.get("DSA_CMAKE_ARGS", ""))
        subprocess.run(configure, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "--build", str(build), "--target", "_dsa", "-j", jobs], check=True)
        built = sorted((build / "python" / "dsa").glob("_dsa*.so"))
        if not built:
            raise RuntimeError("CMake built no dsa/_dsa*.so under " + str(build))
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[0], target)


setup(
    packages=["dsa", "dsa.integrations"],
    package_dir={"dsa": "python/dsa", "dsa.integrations": "python/dsa/integrations"},
    ext_modules=[Extension("dsa._dsa", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)

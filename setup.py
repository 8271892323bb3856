"""The Python module's extension built by tapegrad's own CMake (pyproject.toml names the package): configure a
Release build of the library and the module `_tapegrad`, then copy the module into the wheel's tapegrad/.
TAPEGRAD_CMAKE_BUILD_DIR: an existing build folder to build in (and reuse) instead of a fresh one."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCE_DIR = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = Path(os.environ.get("TAPEGRAD_CMAKE_BUILD_DIR") or Path(self.build_temp).resolve() / "cmake")
        configure = ["cmake", "-S", str(SOURCE_DIR), "-B", str(build), f"-DPython3_EXECUTABLE={sys.executable}"]
        if not (build / "CMakeCache.txt").exists():
            configure += ["-DCMAKE_BUILD_TYPE=Release", "-DTAPEGRAD_BUILD_TESTS=OFF"]
            if shutil.which("ninja"):
                configure += ["-G", "Ninja"]
        subprocess.run(configure, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
        subprocess.run(["cmake", "--build", str(build), "--target", "_tapegrad", "-j", jobs], check=True)
        built = sorted((build / "python" / "tapegrad").glob("_tapegrad*.so"))
        if not built:
            raise RuntimeError(f"the CMake build in {build} made no _tapegrad module (pybind11-dev, python3-dev?)")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[-1], target)


# setuptools' own folder is build-pip/, away from the project's CMake folder build/.
setup(ext_modules=[CMakeExtension("tapegrad._tapegrad")], cmdclass={"build_ext": CMakeBuild},
      options={"build": {"build_base": "build-pip"}})

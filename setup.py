"""pip install --no-build-isolation . : builds attention2d._core with CMake (the library and the
module only, no tests or benchmarks) and installs the Python package. Offline, with Debian's
packages only (scripts/setup.sh installs them). A2D_BUILD_DIR=DIR reuses a configured build tree
instead of a fresh one under build-python/."""

import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(attention2d VERSION ([0-9.]+)", f.read()).group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("A2D_BUILD_DIR") or os.path.join(ROOT, "build-python", "cmake")
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            subprocess.check_call([
                "cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                "-DA2D_WITH_PYTHON=ON", "-DA2D_BUILD_TESTS=OFF", "-DA2D_BUILD_BENCH=OFF",
                "-DPython_EXECUTABLE=" + sys.executable])
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "a2d_python", "-j",
                               str(os.cpu_count() or 2)])
        built = os.path.join(build_dir, "python", "attention2d")
        module = [f for f in os.listdir(built) if f.startswith("_core") and f.endswith(".so")]
        if len(module) != 1:
            raise RuntimeError("expected one _core module in %s, found %s" % (built, module))
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(built, module[0]), target)


setup(
    name="attention2d",
    version=version(),
    description="Exact distributed self-attention (ATTENTION2D) for PyTorch and numpy",
    packages=["attention2d"],
    package_dir={"": "python"},
    ext_modules=[Extension("attention2d._core", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": os.path.join("build-python", "setuptools")},
             "egg_info": {"egg_base": "build-python"}},
    python_requires=">=3.9",
    install_requires=["numpy", "mpi4py"],
    zip_safe=False,
)

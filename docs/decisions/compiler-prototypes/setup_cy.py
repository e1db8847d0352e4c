import sys
from setuptools import setup
from Cython.Build import cythonize
mods = [l.strip() for l in open("../hot.txt") if l.strip()]
setup(name="x", ext_modules=cythonize(mods, language_level=3, nthreads=1,
      compiler_directives={"binding": True, "embedsignature": False}), script_args=["build_ext", "--inplace"])

"""The one compiled module: a trajectory's wire form for the stream's two ends, encoded, checked
and made into arrays in one pass each (transport/_wire.c); everything else is in pyproject.toml.
It is optional: where it cannot be built (no C compiler), the install goes on, transport/wire.py
and transport/schema.py do the same through msgspec and numpy, and the learner's receiver says
so when it starts."""

import numpy
from setuptools import Extension, setup

setup(ext_modules=[Extension("transport._wire", ["transport/_wire.c"],
                             include_dirs=[numpy.get_include()],
                             extra_compile_args=["-O3"], optional=True)])

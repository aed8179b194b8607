"""The one compiled module: the trajectory stream's flags byte, packed and checked in one pass
(transport/_flags.c); everything else is in pyproject.toml. It is optional: where it cannot be
built (no C compiler), the install goes on, transport/flags.py does the same in numpy, and the
learner's receiver says so when it starts."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("transport._flags", ["transport/_flags.c"],
                             extra_compile_args=["-O3"], optional=True)])

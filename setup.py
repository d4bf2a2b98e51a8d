"""The compiled accelerators: optional C twins of a few pure-Python hot paths.

Everything else is in pyproject.toml. Each extension here is `optional`: where no C compiler is
at hand (the slim Docker image) the build goes on without it and the pure-Python code it
mirrors runs instead, with the same results, only slower. The tests hold the two to the same
answers on arbitrary input (tests/test_speedups.py).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("adapters.beep._speedups", ["adapters/beep/_speedups.c"], optional=True),
    Extension("adapters.apex._speedups", ["adapters/apex/_speedups.c"], optional=True),
])

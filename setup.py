"""The compiled accelerators: optional C twins of a few pure-Python hot paths.

Everything else is in pyproject.toml. Each extension here is `optional`: where no C compiler is
at hand (the slim Docker image) the build goes on without it and the pure-Python code it
shortcuts (the general path, which defines the format) runs instead, with the same results,
only slower. Property tests hold each twin to that code, or to a test oracle of its layout, on
arbitrary input (tests/beep/test_fast_paths.py,
tests/apex/test_canonical_speedups.py, tests/apex/test_batch_speedups.py,
tests/broker/test_link_writer.py); tests/test_speedups.py checks that the build made them. Keep
this list and `broker.speedups.ACCELERATORS` the same.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("adapters.beep._speedups", ["adapters/beep/_speedups.c"], optional=True),
    Extension("adapters.apex._speedups", ["adapters/apex/_speedups.c"], optional=True),
    Extension("broker._speedups", ["broker/_speedups.c"], optional=True),
])

"""Helpers the tests share: local servers, a one-node Slurm, range recorders, host builds of the CUDA sources.

Import them as ``from tests.helpers import servers`` (pytest puts the
repository root on the import path). Nothing here is imported at package import
time, so a helper that must run in a fresh process (``cubed_gpu_check``) can
be started with ``python -m tests.helpers.cubed_gpu_check``.
"""

"""The compressors the GPU decode path takes: importing this module registers each one's device steps.

Adding a compressor is adding its module (a :class:`.steps.DeviceSteps`
registered under the codec's metadata name) and importing it here; the driver
(:mod:`.decode`) imports this module and nothing imports it back.
Only imported on the GPU path: importing it imports cupy.
"""

from __future__ import annotations

from gpuzarr_dist.cuda import blosc, deflate, lz4, zstd  # noqa: F401 - imported for their registrations

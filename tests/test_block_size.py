"""``gpuzarr.block-size.gpu: auto``: sized from the GPU's memory, bounded, and the minimum without a GPU."""

from __future__ import annotations

import dask
import pytest

from gpuzarr_dist import config
from gpuzarr_dist.cuda import device

MiB = 1 << 20


@pytest.mark.parametrize(
    "memory, expected",
    [
        (0, 256 * MiB),  # no GPU seen by the process building the graph
        (16 * 10**9, 256 * MiB),  # small GPUs keep the floor
        (40 * 10**9, 256 * MiB),
        (80 * 10**9, (80 * 10**9 // 160) // MiB * MiB),  # 476 MiB
        (149_250_000_000, 889 * MiB),  # an H200 (139 GiB): 149.25 GB / 160 = 889.6 MiB, whole MiB
        (400 * 10**9, 1024 * MiB),  # capped at 1 GiB
    ],
)
def test_auto_gpu_block_follows_device_memory(monkeypatch, memory, expected):
    monkeypatch.setattr(device, "gpu_memory_bytes", lambda: memory)
    with dask.config.set({"gpuzarr.block-size.gpu": "auto"}):
        assert config.block_size_bytes("gpu") == expected
    assert expected == max(256 * MiB, min(1 << 30, memory // 160 // MiB * MiB))  # the documented rule, by hand


def test_auto_is_the_gpu_default_and_explicit_sizes_win(monkeypatch):
    monkeypatch.setattr(device, "gpu_memory_bytes", lambda: 149_250_000_000)
    assert dask.config.get("gpuzarr.block-size.gpu") == "auto"
    assert config.block_size_bytes("gpu") == 889 * MiB
    with dask.config.set({"gpuzarr.block-size.gpu": "300 MiB"}):
        assert config.block_size_bytes("gpu") == 300 * MiB
    with dask.config.set({"gpuzarr.block-size.gpu": " AUTO "}):
        assert config.block_size_bytes("gpu") == 889 * MiB
    assert config.block_size_bytes("cpu") == 128 * MiB  # the CPU default is unchanged


def test_gpu_memory_is_zero_without_a_usable_gpu(monkeypatch):
    monkeypatch.setattr(device, "gpu_status", lambda: (False, "no CUDA device is visible"))
    assert device.gpu_memory_bytes() == 0


@pytest.mark.gpu
def test_gpu_memory_matches_cupy():
    cupy = pytest.importorskip("cupy")
    free, total = cupy.cuda.runtime.memGetInfo()
    assert device.gpu_memory_bytes() == total

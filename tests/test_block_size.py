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
        assert config.block_size_bytes("gpu", device.gpu_memory_bytes) == expected
        assert config.auto_gpu_block_bytes(memory) == expected
    assert expected == max(256 * MiB, min(1 << 30, memory // 160 // MiB * MiB))  # the documented rule, by hand


def test_auto_is_the_gpu_default_and_explicit_sizes_win(monkeypatch):
    monkeypatch.setattr(device, "gpu_memory_bytes", lambda: 149_250_000_000)
    assert dask.config.get("gpuzarr.block-size.gpu") == "auto"
    assert config.block_size_bytes("gpu", device.gpu_memory_bytes) == 889 * MiB
    with dask.config.set({"gpuzarr.block-size.gpu": "300 MiB"}):
        assert config.block_size_bytes("gpu", device.gpu_memory_bytes) == 300 * MiB
    with dask.config.set({"gpuzarr.block-size.gpu": " AUTO "}):
        assert config.block_size_bytes("gpu", device.gpu_memory_bytes) == 889 * MiB
    assert config.block_size_bytes("cpu") == 128 * MiB  # the CPU default is unchanged
    assert config.block_size_bytes("gpu") == 256 * MiB  # auto without a GPU memory to size from: the floor


def test_callers_size_auto_blocks_from_the_gpu(monkeypatch):
    """The graph builder and ``gpuzarr-dist info`` ask cuda.device for the GPU's memory (config imports no device)."""
    from gpuzarr_dist.array import read

    seen = []
    monkeypatch.setattr(read, "gpu_memory_bytes", lambda: seen.append(1) or 149_250_000_000)
    monkeypatch.setattr(read, "auto_block_shape", lambda spec, target, balance=False: (target,))

    class Spec:  # only the shape matters once auto_block_shape is replaced
        shape = (1 << 40,)

    assert read._block_chunks(Spec(), "auto", "gpu")[0][0] == 889 * MiB
    assert seen
    seen.clear()
    assert read._block_chunks(Spec(), "auto", "cpu")[0][0] == 128 * MiB
    assert not seen  # the CPU's size never asks the GPU


def test_gpu_memory_is_zero_without_a_usable_gpu(monkeypatch):
    monkeypatch.setattr(device, "gpu_status", lambda: (False, "no CUDA device is visible"))
    assert device.gpu_memory_bytes() == 0


@pytest.mark.gpu
def test_gpu_memory_matches_cupy():
    cupy = pytest.importorskip("cupy")
    free, total = cupy.cuda.runtime.memGetInfo()
    assert device.gpu_memory_bytes() == total

"""The machine's NVIDIA GPUs as the driver reports them: index, name, memory, driver version.

Used by ``gpuzarr-dist info`` and :func:`gpuzarr_dist.start_cluster`. The list
comes from NVML (``pynvml``, which dask-cuda installs) or, without it, from
``nvidia-smi``; neither creates a CUDA context, so asking costs no device
memory and works before worker processes pin their GPU. Nothing here imports
cupy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuInfo:
    index: int  # the driver's index (nvidia-smi's), not the CUDA_VISIBLE_DEVICES-relative one
    name: str
    memory_total: int  # bytes
    driver: str
    uuid: str = ""

    def describe(self) -> str:
        return f"GPU {self.index}: {self.name}, {self.memory_total / 2**30:.1f} GiB, driver {self.driver}"


def _from_nvml() -> list[GpuInfo] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            out.append(GpuInfo(
                index=i,
                name=name.decode() if isinstance(name, bytes) else str(name),
                memory_total=int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                driver=driver,
                uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
            ))
        return out
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


NVIDIA_SMI_QUERY = ["--query-gpu=index,name,memory.total,driver_version,uuid", "--format=csv,noheader,nounits"]


def parse_nvidia_smi(text: str) -> list[GpuInfo]:
    """GPUs from ``nvidia-smi`` CSV output (``NVIDIA_SMI_QUERY``; memory in MiB)."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        try:
            mem = int(float(parts[2])) * 2**20
        except ValueError:
            mem = 0
        out.append(GpuInfo(int(parts[0]), parts[1], mem, parts[3], parts[4] if len(parts) > 4 else ""))
    return out


def _from_nvidia_smi() -> list[GpuInfo] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_nvidia_smi(r.stdout) if r.returncode == 0 else None


def list_gpus() -> list[GpuInfo]:
    """Every GPU the driver sees (ignoring ``CUDA_VISIBLE_DEVICES``); empty without a driver."""
    for probe in (_from_nvml, _from_nvidia_smi):
        found = probe()
        if found is not None:
            return found
    return []


def visible_devices() -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs), or None when it is unset."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return None
    return [d.strip() for d in env.split(",") if d.strip()]

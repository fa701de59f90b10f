"""What the schedules need to know about the device, without requiring one.

On a machine with no GPU (compile-only), the answers are those of the project's target, an H200.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

H200_SMS = 132
H200_L2_BYTES = 60 * 1024 * 1024


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    num_sms: int
    l2_bytes: int
    capability: tuple[int, int]


@functools.lru_cache(maxsize=None)
def device_info(index: int | None = None) -> DeviceInfo:
    """Properties of CUDA device `index` (the current one by default), or the H200 defaults."""
    try:
        import torch

        if torch.cuda.is_available():
            idx = torch.cuda.current_device() if index is None else index
            p = torch.cuda.get_device_properties(idx)
            return DeviceInfo(p.name, p.multi_processor_count, p.L2_cache_size, (p.major, p.minor))
    except Exception:  # pragma: no cover - torch without CUDA support
        pass
    return DeviceInfo("NVIDIA H200 (assumed: no GPU present)", H200_SMS, H200_L2_BYTES, (9, 0))


def num_sms(index: int | None = None) -> int:
    return device_info(index).num_sms

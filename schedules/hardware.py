"""What the schedules need to know about the device, without requiring one.

On a machine with no GPU (compile-only), the answers are those of the project's target, an H200.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

H200_SMS = 132
H200_L2_BYTES = 60 * 1024 * 1024

# The launch attribute that fixes a kernel's register count at entry (`.minnctapersm 1`: one CTA per SM, so ptxas
# gives the kernel all the registers the launch allows). A kernel that moves registers between warpgroups with
# setmaxnreg needs it whenever ptxas would otherwise pick fewer: it then ignores setmaxnreg (C7508) and the consumers
# stay capped at that count (or it serializes their WGMMAs, C7512).
SETMAXNREG_LAUNCH = {"min_blocks_per_mp": 1}


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


def _gpc_bound_clusters(sms: int, cluster_size: int) -> int:
    """Clusters of `cluster_size` CTAs (one per SM) that fit at once when the SMs come in GPCs of
    at least 16 (H100 / H200: 132 SMs; a cluster never spans GPCs): pairs fit any TPC, larger
    clusters leave each GPC's remainder idle (4: 32 clusters = 128 SMs, not 33)."""
    if cluster_size <= 2:
        return max(1, sms // cluster_size)
    return max(1, (sms // 16) * (16 // cluster_size))


@functools.lru_cache(maxsize=None)
def max_active_clusters(cluster_size: int, index: int | None = None) -> int:
    """Clusters of `cluster_size` one-CTA-per-SM blocks co-resident on device `index` (the
    occupancy API, through `cutlass.utils.HardwareInfo`); a persistent grid must not exceed it or
    the surplus clusters run after the others finished (a second, nearly empty wave). Without a
    GPU, or if the query fails, the GPC bound of `_gpc_bound_clusters` (conservative)."""
    sms = num_sms(index)
    fallback = _gpc_bound_clusters(sms, cluster_size)
    if cluster_size <= 1:
        return sms
    try:
        import torch

        if not torch.cuda.is_available():
            return fallback
        torch.cuda.init()
        from cutlass.utils import HardwareInfo

        idx = torch.cuda.current_device() if index is None else index
        with torch.cuda.device(idx):
            torch.zeros(1, device=f"cuda:{idx}")  # a current context for the driver API
            got = HardwareInfo(idx).get_max_active_clusters(cluster_size)
        return max(1, min(int(got), sms // cluster_size))
    except Exception:  # pragma: no cover - driver API unavailable
        return fallback

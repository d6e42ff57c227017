"""Host data onto the device without a host sync."""

from __future__ import annotations

import torch


def upload(values: list, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A host list as a tensor on ``device`` without blocking the host: pinned memory and a non-blocking copy on an
    accelerator (the caching host allocator keeps the pinned block alive until the copy ran); on the CPU, the tensor."""
    host = torch.tensor(values, dtype=dtype, device="cpu")
    if torch.device(device).type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)

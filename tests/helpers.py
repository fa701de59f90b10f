"""Shared test helpers: fresh random inputs, poisoned outputs, dtype-aware error bounds."""

from __future__ import annotations

import torch

EPS = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


def randn(*shape, dtype=torch.bfloat16, device="cuda", seed=None):
    g = torch.Generator(device=device)
    g.manual_seed(seed if seed is not None else torch.randint(0, 2**31 - 1, ()).item())
    return torch.randn(*shape, generator=g, dtype=torch.float32, device=device).to(dtype)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    den = ref.norm().item()
    return (out - ref).norm().item() / (den if den else 1.0)

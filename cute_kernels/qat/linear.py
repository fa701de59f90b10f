"""`QATLinear`: a linear layer trained with fake-quantized weight and activation, around `ck.gemm`.

The quantization is torch's default fused QAT qconfig for x86 / fbgemm (`torch.ao.nn.qat.Linear` under
`get_default_qat_qconfig`): the activation per-tensor affine on [0, 255], the weight per-channel symmetric on
[-128, 127] along the output features, each with a moving-average min / max observer (averaging constant 0.01) fused
with its fake-quant (`fake_quant_observed`: a reduce pass and a quantize pass, no host sync). In training mode the
observers update their running ranges and qparams every call; in eval mode they are off and the last qparams are
used; `fake_quant_enabled` = 0 passes both operands through. The gradients are the STE's (dy where the value was
in range) and the GEMM's.
"""

from __future__ import annotations

import math

import torch

from cute_kernels.qat.ops import fake_quant_observed

ACT_RANGE = (0, 255)
WEIGHT_RANGE = (-128, 127)


class QATLinear(torch.nn.Module):
    """y = fq(x) @ fq(weight)^T + bias for x (..., in_features) in bf16 / fp16 (the weight's dtype)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype: torch.dtype = torch.bfloat16,
        averaging_constant: float = 0.01,
    ):
        super().__init__()
        if dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"dtype must be bfloat16 or float16 (ck.gemm's operands), got {dtype}")
        if in_features < 1 or out_features < 1:
            raise ValueError(f"in_features and out_features must be positive, got {in_features}, {out_features}")
        self.in_features, self.out_features, self.averaging_constant = in_features, out_features, averaging_constant
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        self.reset_parameters()
        f32 = dict(device=device, dtype=torch.float32)
        inf = float("inf")
        for prefix, c in (("act", 1), ("weight", out_features)):
            self.register_buffer(f"{prefix}_min", torch.full((c,), inf, **f32))
            self.register_buffer(f"{prefix}_max", torch.full((c,), -inf, **f32))
            self.register_buffer(f"{prefix}_scale", torch.ones(c, **f32))
            self.register_buffer(f"{prefix}_zero_point", torch.zeros(c, device=device, dtype=torch.int32))
        self.register_buffer("observer_enabled", torch.ones(1, device=device, dtype=torch.long))
        self.register_buffer("fake_quant_enabled", torch.ones(1, device=device, dtype=torch.long))
        self.register_buffer("_observer_off", torch.zeros(1, device=device, dtype=torch.long), persistent=False)

    def reset_parameters(self) -> None:
        """torch.nn.Linear's initialization."""
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def fake_quant_operands(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(fq(x), fq(weight)) with the observers of the current mode (training: on)."""
        if x.dtype != self.weight.dtype:
            raise TypeError(f"x has dtype {x.dtype} but the layer's weight is {self.weight.dtype}")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"x must be (..., {self.in_features}), got shape {tuple(x.shape)}")
        obs = self.observer_enabled if self.training else self._observer_off
        c = self.averaging_constant
        xq = fake_quant_observed(
            x,
            obs,
            self.fake_quant_enabled,
            self.act_min,
            self.act_max,
            self.act_scale,
            self.act_zero_point,
            c,
            *ACT_RANGE,
            0,
            False,
            False,
        )
        wq = fake_quant_observed(
            self.weight,
            obs,
            self.fake_quant_enabled,
            self.weight_min,
            self.weight_max,
            self.weight_scale,
            self.weight_zero_point,
            c,
            *WEIGHT_RANGE,
            0,
            True,
            True,
        )
        return xq, wq

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import cute_kernels as ck

        xq, wq = self.fake_quant_operands(x)
        y = ck.gemm(xq.reshape(-1, self.in_features), wq.t(), self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

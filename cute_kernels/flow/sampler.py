"""Fixed-grid ODE sampling for flow matching: x(t1) of dx/dt = v(x, t) from x(t0) = x0, by `steps` uniform steps of
Euler, midpoint, Heun or RK4, with optional classifier-free guidance; each stage point and each final combination is
one `flow_update`, and the whole N-step loop is captured in one CUDA graph when the velocity function allows it.

A sampler step of a robot policy's action chunk (50 actions x 32 dims) is tiny: the network's GEMMs, norms and
activations and the update each run for a few microseconds, so an eager loop is bound by the host's launches (one
reported pi0.5 request on an H200 does 50 ms of GPU work in about 190 ms, 9,995 kernels). Replaying a graph costs
the host one call for the whole trajectory.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict

import torch

# method: (stages, b). A stage is (c, a): evaluated at t + c dt on x + dt * sum_j a[j] k_j; the step ends at
# x + dt * sum_i b[i] k_i. torchdiffeq's fixed-grid tableaux: its "rk4" is the 3/8 rule (`rk4_alt_step_func`),
# "heun2" the trapezoid (explicit Heun), "heun3" Heun's third-order method.
TABLEAUX: dict[str, tuple[tuple[tuple[float, tuple[float, ...]], ...], tuple[float, ...]]] = {
    "euler": (((0.0, ()),), (1.0,)),
    "midpoint": (((0.0, ()), (0.5, (0.5,))), (0.0, 1.0)),
    "heun2": (((0.0, ()), (1.0, (1.0,))), (0.5, 0.5)),
    "heun3": (((0.0, ()), (1 / 3, (1 / 3,)), (2 / 3, (0.0, 2 / 3))), (0.25, 0.0, 0.75)),
    "rk4": (((0.0, ()), (1 / 3, (1 / 3,)), (2 / 3, (-1 / 3, 1.0)), (1.0, (1.0, -1.0, 1.0))),
            (0.125, 0.375, 0.375, 0.125)),
}
ALIASES = {"heun": "heun2"}


def tableau(method: str):
    """(stages, b) of `method` (`TABLEAUX`, or an alias: "heun" is "heun2")."""
    m = ALIASES.get(method, method)
    if m not in TABLEAUX:
        raise ValueError(f"method must be one of {tuple(TABLEAUX) + tuple(ALIASES)}, got {method!r}")
    return TABLEAUX[m]


class FlowSampler:
    """x(t1) from x(t0) = x0 by `steps` uniform steps of `method`, every update by `ck.flow_update`.

    `velocity_fn(x, t)` returns the velocity like x (or, with `cfg_scale`, the pair (uncond, cond)); t is a 0-d fp32
    CUDA tensor (a view into a table of the grid's stage times, filled before capture). With `graph` (default), the
    first call for a shape / dtype / device runs the loop twice on a side stream (compiling every kernel; the second
    time with host synchronizations turned into errors), then captures the whole loop into one CUDA graph; later
    calls copy x0 in and replay it. If that fails (a velocity function that syncs with the host or allocates outside
    the graph's pool), the sampler warns once and runs that shape eagerly from then on. The result is a new tensor unless `copy_out=False`, which hands back the
    graph's output buffer (overwritten by the next call). Runs under `torch.no_grad()`."""

    def __init__(self, velocity_fn, steps: int, method: str = "euler", cfg_scale: float | None = None, t0: float = 0.0,
                 t1: float = 1.0, graph: bool = True, copy_out: bool = True):
        if not callable(velocity_fn):
            raise TypeError(f"velocity_fn must be callable, got {type(velocity_fn).__name__}")
        if int(steps) != steps or steps < 1:
            raise ValueError(f"steps must be a positive integer, got {steps}")
        self.stages, self.b = tableau(method)
        self.velocity_fn, self.steps, self.method = velocity_fn, int(steps), method
        self.cfg_scale = None if cfg_scale is None else float(cfg_scale)
        self.t0, self.t1, self.graph, self.copy_out = float(t0), float(t1), graph, copy_out
        grid = torch.linspace(self.t0, self.t1, self.steps + 1, dtype=torch.float64)
        self.dts = (grid[1:] - grid[:-1]).tolist()
        # stage times (steps, stages), as torchdiffeq forms them: t_n + c dt; handed to velocity_fn in `time_dtype`
        self._times_host = torch.tensor([[grid[n].item() + c * self.dts[n] for c, _ in self.stages]
                                         for n in range(self.steps)], dtype=torch.float64)
        self.time_dtype = torch.float32
        self._times: dict = {}
        self._graphs: dict = {}
        self.graph_error: dict = {}

    def times(self, device) -> torch.Tensor:
        t = self._times.get(device)
        if t is None:
            t = self._times[device] = self._times_host.to(device=device, dtype=self.time_dtype)
        return t

    def loop(self, x: torch.Tensor) -> torch.Tensor:
        """The N-step loop, eagerly (what the graph captures)."""
        from cute_kernels.flow.ops import flow_update

        times = self.times(x.device)
        cfg = self.cfg_scale
        for n in range(self.steps):
            dt = self.dts[n]
            ks = []
            for i, (_, a) in enumerate(self.stages):
                xi = x if not any(a) else flow_update(x, ks[: len(a)], a, dt, cfg)
                k = self.velocity_fn(xi, times[n, i])
                ks.append(tuple(k) if cfg is not None else k)
            x = flow_update(x, ks, self.b, dt, cfg)
        return x

    def _capture(self, x0: torch.Tensor):
        static_in = x0.detach().clone(memory_format=torch.contiguous_format)
        side = torch.cuda.Stream(device=x0.device)
        side.wait_stream(torch.cuda.current_stream(x0.device))
        with torch.cuda.stream(side):
            self.loop(static_in)  # compiles every kernel and settles lazy state before capture
            # A second run with host synchronizations made errors: a velocity function that syncs (.item(), a
            # data-dependent shape) fails here, not inside the capture, whose failure can leave CUDA's RNG state
            # registered to a dead graph ("Offset increment outside graph capture" in later random draws).
            previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("error")
            try:
                self.loop(static_in)
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        torch.cuda.current_stream(x0.device).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = self.loop(static_in)
        return static_in, static_out, g

    @torch.no_grad()
    def __call__(self, x0: torch.Tensor) -> torch.Tensor:
        if not isinstance(x0, torch.Tensor) or not x0.is_cuda:
            raise ValueError(f"x0 must be a CUDA tensor, got {type(x0).__name__}"
                             f"{'' if not isinstance(x0, torch.Tensor) else ' on ' + str(x0.device)}")
        key = (tuple(x0.shape), x0.dtype, x0.device)
        if not self.graph or key in self.graph_error or torch.cuda.is_current_stream_capturing():
            return self.loop(x0)
        entry = self._graphs.get(key)
        if entry is None:
            try:
                entry = self._graphs[key] = self._capture(x0)
            except Exception as e:  # the velocity function cannot be captured: run this shape eagerly
                self.graph_error[key] = f"{type(e).__name__}: {e}"
                warnings.warn(f"FlowSampler: capture failed ({self.graph_error[key]}); running eagerly", stacklevel=2)
                return self.loop(x0)
        static_in, static_out, g = entry
        static_in.copy_(x0)
        g.replay()
        return static_out.clone() if self.copy_out else static_out


_SAMPLERS: OrderedDict = OrderedDict()
_KEEP = 8


def sample_flow(velocity_fn, x0: torch.Tensor, steps: int, method: str = "euler", cfg_scale: float | None = None,
                t0: float = 0.0, t1: float = 1.0, graph: bool = True) -> torch.Tensor:
    """x(t1) of dx/dt = velocity_fn(x, t) from x(t0) = x0 by `steps` fixed steps of `method` ("euler", "midpoint",
    "heun" / "heun2", "heun3", "rk4": torchdiffeq's tableaux), guided by `cfg_scale` when given (velocity_fn then
    returns (uncond, cond)). The loop runs as one CUDA graph when velocity_fn is capturable (`FlowSampler`, kept for
    the last 8 (velocity_fn, steps, method, cfg_scale, t0, t1, graph) combinations)."""
    key = (velocity_fn, steps, method, cfg_scale, t0, t1, graph)
    s = _SAMPLERS.get(key)
    if s is None:
        s = _SAMPLERS[key] = FlowSampler(velocity_fn, steps, method, cfg_scale, t0, t1, graph)
        if len(_SAMPLERS) > _KEEP:
            _SAMPLERS.popitem(last=False)
    else:
        _SAMPLERS.move_to_end(key)
    return s(x0)

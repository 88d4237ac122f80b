"""The warp kernels' text run on the CPU, lane by lane, with their synchronisation kept.

Every ``cuda.syncwarp()`` statement of the generated text becomes ``yield 0`` and every
``cuda.syncthreads()`` ``yield 1``, so the kernel is a generator: one per lane, resumed round by
round, a round being the code between two synchronisations.  Within a round the lanes of a warp
run one after another in a chosen order (``lane_order``: "forward", "reverse" or "shuffle"), so
a result that depends on the order -- a lane reading what another writes in the same round --
shows up as a difference between orders (tests run two).  A block of several warps (the
sensitivity kernel's direction warps) runs warp after warp from one block barrier to the next,
in ``warp_order`` ("forward" or "reverse"): a warp reading what another writes between two
barriers shows up the same way.  Shared arrays are one numpy array per block, local arrays per
lane, both NaN-filled so that a read of an unwritten value poisons the result; every lane of a
warp must reach the same synchronisations, and every warp of a block the same barriers
(checked).  Slow; for tests, and for ``CudaBackend(launch="emulated")`` on linear right-hand
sides.
"""
from __future__ import annotations

import numpy as np

from .codegen.warp import SYNC
from .codegen.warp_writer import BSYNC
from .modules import load_module
from .inputs import pad_directions, plain_outputs, sens_call_args, sens_outputs, trim_directions
from .results import SensitivitySolution, kernel_solution
from .tables import args_array

__all__ = ["warp_emulation_module", "run_warps", "emulate_warp", "emulate_warp_sens",
           "warp_jacobian_emulated"]


class _Dim:
    x = 0


class _Local:
    @staticmethod
    def array(shape, dtype):
        return np.full(shape, np.nan)


class _Shared:
    def __init__(self, emu):
        self.emu = emu

    def array(self, shape, dtype):
        emu = self.emu
        k = emu.calls.get(emu.thread, 0)
        emu.calls[emu.thread] = k + 1
        if k == len(emu.block_shared):
            emu.block_shared.append(np.full(shape, np.nan))
        return emu.block_shared[k]


class _WarpEmu:
    """Stand-in for ``numba_cuda_mlir.cuda`` as the warp kernel uses it."""

    def __init__(self):
        self.threadIdx, self.blockIdx, self.blockDim = _Dim(), _Dim(), _Dim()
        self.local = _Local()
        self.shared = _Shared(self)
        self.thread = 0
        self.calls: dict = {}
        self.block_shared: list = []


def warp_emulation_module(plan, module_dir=None):
    """(module, emulator): the plan's text with its synchronisations as ``yield``."""
    marks = {SYNC: "yield 0", BSYNC: "yield 1"}
    lines = [ln[:len(ln) - len(ln.lstrip())] + marks[ln.strip()] if ln.strip() in marks else ln
             for ln in plan.source.splitlines()]
    mod, _ = load_module("\n".join(lines) + "\n", "warp_emu", "emu", id(plan), module_dir)
    emu = _WarpEmu()
    mod.cuda = emu
    mod.F64 = np.float64
    mod.U64 = int
    mod.table_values = plan.split.lookup_device
    mod.table_values_dt = plan.split.lookup_dt_device
    return mod, emu


def run_warps(fn, call_args, n_blocks, plan, emu, lane_order="forward", seed=0, warps=1,
              warp_order="forward"):
    """Run generator kernel ``fn`` over ``n_blocks`` blocks of ``warps`` warps each."""
    W = plan.lanes
    rng = np.random.default_rng(seed)
    emu.blockDim.x = W * warps
    for block in range(n_blocks):
        emu.block_shared, emu.calls = [], {}
        emu.blockIdx.x = block
        gens = {}
        for tid in range(W * warps):
            emu.thread = emu.threadIdx.x = tid
            gens[tid] = fn(*call_args)
        live = list(range(warps))
        while live:
            ended = []
            for wb in (live if warp_order == "forward" else live[::-1]):
                if _to_barrier(gens, [wb * W + lane for lane in range(W)], emu, lane_order,
                               rng, f"block {block} warp {wb}"):
                    ended.append(wb)
            if ended and len(ended) != len(live):
                raise AssertionError(f"block {block}: warps {sorted(ended)} ended while others "
                                     "wait at a block barrier")
            live = [wb for wb in live if wb not in ended]


def _to_barrier(gens, tids, emu, lane_order, rng, where) -> bool:
    """Advance one warp's lanes round by round to its next block barrier; True if it ended."""
    while True:
        order = list(tids)
        if lane_order == "reverse":
            order.reverse()
        elif lane_order == "shuffle":
            rng.shuffle(order)
        done, kinds = [], set()
        for tid in order:
            emu.thread = emu.threadIdx.x = tid
            try:
                kinds.add(next(gens[tid]))
            except StopIteration:
                done.append(tid)
        if done:
            if len(done) != len(tids):
                raise AssertionError(f"{where}: lanes {sorted(done)} ended while others wait at "
                                     "a synchronisation")
            return True
        if len(kinds) != 1:
            raise AssertionError(f"{where}: lanes wait at different synchronisations")
        if kinds.pop() == 1:
            return False


def emulate_warp(plan, inp, args, lane_order="forward", module_dir=None):
    """The warp kernel on kernel inputs (``inputs.kernel_inputs``), emulated: a Solution."""
    mod, emu = warp_emulation_module(plan, module_dir)
    N, n, m = inp["N"], inp["n"], inp["t_save"].shape[1]
    ys, t_out, st, nacc, nrej = plain_outputs(N, m, n)
    call = (inp["y0"], inp["t0"], inp["t_end"], inp["t_save"], inp["params"], args_array(args),
            inp["rtol"], inp["atol"], inp["weights"], inp["h0"], inp["n_weighted"], ys, t_out,
            st, nacc, nrej, N, plan.sched, plan.sched_f)
    run_warps(mod.kernel, call, N, plan, emu, lane_order)
    return kernel_solution(ys, t_out, st, nacc, nrej, "cuda-emulated",
                           {"kernel": "warp", "lanes": plan.lanes, "jacobian": "direct",
                            "jacobian_colors": 0, "lu_slots": int(plan.linear.nslots),
                            "table_values": plan.spec.n_tv,
                            "levels": (plan.schedule.n_factor_levels,
                                       plan.schedule.n_forward_levels,
                                       plan.schedule.n_backward_levels)})


def emulate_warp_sens(plan, inp, args, lane_order="forward", module_dir=None, dir_warps=None,
                      warp_order="forward"):
    """The warp sensitivity kernel on ``inputs.sens_inputs``, emulated: a block per
    (trajectory, group of directions), a warp per direction (``dir_warps`` at most, default the
    plan's); a SensitivitySolution."""
    mod, emu = warp_emulation_module(plan, module_dir)
    m = inp["m"]
    nw = plan.direction_warps(m, dir_warps)
    inp = pad_directions(inp, nw)
    out = sens_outputs(inp)
    call = sens_call_args(inp, args_array(args), out) + (plan.sched, plan.sched_f)
    run_warps(mod.sens_kernel, call, inp["N"] * (inp["m"] // nw), plan, emu, lane_order,
              warps=nw, warp_order=warp_order)
    out = trim_directions(out, m)
    return SensitivitySolution(out["ys"], out["dys"], out["status"], out["t_out"],
                               out["n_accepted"], out["n_rejected"], "cuda-emulated",
                               {"kernel": "warp", "lanes": plan.lanes, "direction_warps": nw,
                                "threads": inp["N"] * inp["m"] * plan.lanes,
                                "directions": m})


def warp_jacobian_emulated(plan, y, t, params, args, lane_order="forward"):
    """(f, J in slot layout, df/dt) at points (N, n) through the warp kernel's ``jac_kernel``."""
    mod, emu = warp_emulation_module(plan)
    y = np.ascontiguousarray(np.atleast_2d(np.asarray(y, np.float64)))
    N = y.shape[0]
    t = np.ascontiguousarray(np.broadcast_to(np.asarray(t, np.float64), (N,)))
    params = np.ascontiguousarray(np.asarray(params, np.float64).reshape(N, -1))
    f = np.full((N, plan.n), np.nan)
    jv = np.full((N, plan.linear.nslots), np.nan)
    dfdt = np.full((N, plan.n), np.nan)
    run_warps(mod.jac_kernel, (y, t, params, args_array(args), f, jv, dfdt, N, plan.sched,
                               plan.sched_f), N, plan, emu, lane_order)
    return f, jv, dfdt

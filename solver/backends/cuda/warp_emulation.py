"""The warp kernel's text run on the CPU, lane by lane, with its synchronisation kept.

Every ``cuda.syncwarp()`` statement of the generated text becomes ``yield``, so the kernel is a
generator: one per lane, resumed round by round, a round being the code between two
synchronisations.  Within a round the lanes run one after another in a chosen order
(``lane_order``: "forward", "reverse" or "shuffle"), so a result that depends on the order -- a
lane reading what another writes in the same round -- shows up as a difference between orders
(tests run two).  Shared arrays are one numpy array per block, local arrays per lane, both
NaN-filled so that a read of an unwritten value poisons the result; every lane of a warp must
reach the same number of synchronisations (checked).  Slow; for tests, and for
``CudaBackend(launch="emulated")`` on linear right-hand sides.
"""
from __future__ import annotations

import numpy as np

from .codegen.warp import SYNC
from .modules import load_module
from .inputs import plain_outputs, sens_call_args, sens_outputs
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
        self.threadIdx, self.blockIdx = _Dim(), _Dim()
        self.local = _Local()
        self.shared = _Shared(self)
        self.thread = 0
        self.calls: dict = {}
        self.block_shared: list = []


def warp_emulation_module(plan, module_dir=None):
    """(module, emulator): the plan's text with its synchronisations as ``yield``."""
    lines = [ln[:len(ln) - len(ln.lstrip())] + "yield" if ln.strip() == SYNC else ln
             for ln in plan.source.splitlines()]
    mod, _ = load_module("\n".join(lines) + "\n", "warp_emu", "emu", id(plan), module_dir)
    emu = _WarpEmu()
    mod.cuda = emu
    mod.F64 = np.float64
    mod.U64 = int
    mod.table_values = plan.split.lookup_device
    mod.table_values_dt = plan.split.lookup_dt_device
    return mod, emu


def run_warps(fn, call_args, n_traj, plan, emu, lane_order="forward", seed=0):
    """Run generator kernel ``fn`` over ``n_traj`` trajectories, a warp at a time."""
    W, wpb = plan.lanes, 1
    rng = np.random.default_rng(seed)
    for block in range(-(-n_traj // wpb)):
        emu.block_shared, emu.calls = [], {}
        emu.blockIdx.x = block
        for wb in range(wpb):
            if block * wpb + wb >= n_traj:
                break
            tids = [wb * W + lane for lane in range(W)]
            gens = {}
            for tid in tids:
                emu.thread = emu.threadIdx.x = tid
                gens[tid] = fn(*call_args)
            running = list(tids)
            while running:
                order = list(running)
                if lane_order == "reverse":
                    order.reverse()
                elif lane_order == "shuffle":
                    rng.shuffle(order)
                done = []
                for tid in order:
                    emu.thread = emu.threadIdx.x = tid
                    try:
                        next(gens[tid])
                    except StopIteration:
                        done.append(tid)
                if done and len(done) != len(running):
                    raise AssertionError(f"block {block} warp {wb}: lanes {sorted(done)} ended "
                                         "while others wait at a syncwarp")
                running = [t for t in running if t not in done]


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


def emulate_warp_sens(plan, inp, args, lane_order="forward", module_dir=None):
    """The warp sensitivity kernel on ``inputs.sens_inputs``, emulated: one warp per
    (trajectory, direction); a SensitivitySolution."""
    mod, emu = warp_emulation_module(plan, module_dir)
    out = sens_outputs(inp)
    call = sens_call_args(inp, args_array(args), out) + (plan.sched, plan.sched_f)
    run_warps(mod.sens_kernel, call, inp["N"] * inp["m"], plan, emu, lane_order)
    return SensitivitySolution(out["ys"], out["dys"], out["status"], out["t_out"],
                               out["n_accepted"], out["n_rejected"], "cuda-emulated",
                               {"kernel": "warp", "lanes": plan.lanes,
                                "threads": inp["N"] * inp["m"] * plan.lanes,
                                "directions": inp["m"]})


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

"""Rosenbrock tableaus as data.

A Rosenbrock method is one shared algorithm (``method.rosenbrock``) plus a table of numbers; the
table lives here so the JAX backend and the CUDA backend read the *same* constants.

Formulation (the "W-transformed" form of Hairer & Wanner, *Solving ODEs II*, §IV.7, as used by
Rodas-type codes): with W = I/(hγ) − J,

    W k_i = f(t + c_i h, y + Σ_{j<i} a_ij k_j) + h d_i ∂f/∂t + Σ_{j<i} (C_ij / h) k_j,

    y_new = y + Σ_i b_i k_i,     error estimate = Σ_i e_i k_i,

and the continuous extension (dense output) for θ ∈ [0, 1]

    y(t + θh) = (1 − θ) y + θ (y_new + (1 − θ)(K_1 + θ (K_2 + θ K_3))),   K_r = Σ_i H_ri k_i.

Rodas5P: Steinebach, "Construction of Rosenbrock–Wanner method Rodas5P and numerical benchmarks
within the Julia Differential Equations package", BIT Numer. Math. 63:27 (2023). Order 5 with an
embedded order-4 solution, 8 stages, stiffly accurate (the last two stages are the "Rodas trick":
the stage argument already is the solution, so b_i equals the last row of a plus the final
increment), L-stable, and of order ≥ 3 for W-perturbed Jacobians.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RosenbrockTableau:
    """Coefficients of an s-stage Rosenbrock method in the W-transformed form above."""

    name: str
    order: int            #: order of the propagated solution
    embedded_order: int   #: order of the embedded solution (the error estimate is O(h^(this+1)))
    gamma: float
    a: np.ndarray         #: (s, s) strictly lower: stage arguments
    C: np.ndarray         #: (s, s) strictly lower: stage couplings
    b: np.ndarray         #: (s,) solution weights
    e: np.ndarray         #: (s,) error-estimate weights
    c: np.ndarray         #: (s,) stage times
    d: np.ndarray         #: (s,) ∂f/∂t weights
    H: np.ndarray         #: (3, s) dense-output coefficients

    @property
    def stages(self) -> int:
        return len(self.b)


def _rodas5p() -> RosenbrockTableau:
    s = 8
    a = np.zeros((s, s))
    C = np.zeros((s, s))
    a[1, 0] = 3.0
    a[2, :2] = [2.849394379747939, 0.45842242204463923]
    a[3, :3] = [-6.954028509809101, 2.489845061869568, -10.358996098473584]
    a[4, :4] = [2.8029986275628964, 0.5072464736228206, -0.3988312541770524, -0.04721187230404641]
    a6 = [-7.502846399306121, 2.561846144803919, -11.627539656261098, -0.18268767659942256,
          0.030198172008377946]
    a[5, :5] = a6
    # Stiffly accurate tail: stage 7 starts from stage 6's argument plus k6, stage 8 adds k7.
    a[6, :6] = a6 + [1.0]
    a[7, :7] = a6 + [1.0, 1.0]
    C[1, 0] = -14.155112264123755
    C[2, :2] = [-17.97296035885952, -2.859693295451294]
    C[3, :3] = [147.12150275711716, -1.41221402718213, 71.68940251302358]
    C[4, :4] = [165.43517024871676, -0.4592823456491126, 42.90938336958603, -5.961986721573306]
    C[5, :5] = [24.854864614690072, -3.0009227002832186, 47.4931110020768, 5.5814197821558125,
                -0.6610691825249471]
    C[6, :6] = [30.91273214028599, -3.1208243349937974, 77.79954646070892, 34.28646028294783,
                -19.097331116725623, -28.087943162872662]
    C[7, :7] = [37.80277123390563, -3.2571969029072276, 112.26918849496327, 66.9347231244047,
                -40.06618937091002, -54.66780262877968, -9.48861652309627]
    b = np.array(a6 + [1.0, 1.0, 1.0])
    e = np.zeros(s)
    e[-1] = 1.0  # the last increment is the difference between the order-5 and order-4 solutions
    c = np.array([0.0, 0.6358126895828704, 0.4095798393397535, 0.9769306725060716,
                  0.4288403609558664, 1.0, 1.0, 1.0])
    d = np.array([0.21193756319429014, -0.42387512638858027, -0.3384627126235924,
                  1.8046452872882734, 2.325825639765069, 0.0, 0.0, 0.0])
    H = np.array([
        [25.948786856663858, -2.5579724845846235, 10.433815404888879, -2.3679251022685204,
         0.524948541321073, 1.1241088310450404, 0.4272876194431874, -0.17202221070155493],
        [-9.91568850695171, -0.9689944594115154, 3.0438037242978453, -24.495224566215796,
         20.176138334709044, 15.98066361424651, -6.789040303419874, -6.710236069923372],
        [11.419903575922262, 2.8879645146136994, 72.92137995996029, 80.12511834622643,
         -52.072871366152654, -59.78993625266729, -0.15582684282751913, 4.883087185713722],
    ])
    return RosenbrockTableau("Rodas5P", 5, 4, 0.21193756319429014, a, C, b, e, c, d, H)


RODAS5P = _rodas5p()

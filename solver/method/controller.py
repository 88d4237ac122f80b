"""Step-size control: a PID controller on the embedded error estimate.

Söderlind, "Digital filters in adaptive time-stepping", ACM TOMS 29 (2003), and Söderlind & Wang,
"Adaptive time-stepping and computational stability", JCAM 185 (2006). With ε_n the weighted RMS
error of step n (accept when ε_n ≤ 1) and k = embedded order + 1, the proposed step ratio is

    h_{n+1}/h_n = safety · ε_n^(−β1/k) · ε_{n−1}^(−β2/k) · ε_{n−2}^(−β3/k),

clipped to [factor_min, factor_max]. The default (β1, β2, β3) = (0.7, −0.4, 0) is the classic PI
controller of Gustafsson (1991) that Hairer & Wanner recommend for stiff problems; (1, 0, 0) is the
elementary controller; (1/3, 1/3, 1/3)·… etc. are Söderlind's filters. After a rejection only the
elementary factor is used and the history is not updated.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PIDController:
    beta1: float = 0.7
    beta2: float = -0.4
    beta3: float = 0.0
    safety: float = 0.9
    factor_min: float = 0.2
    factor_max: float = 6.0
    #: smallest admissible step, relative to max(|t|, 1): below it a trajectory stops with
    #: Status.STEP_TOO_SMALL
    dt_min_rel: float = 1e-14

    def __post_init__(self):
        if not (0 < self.safety <= 1):
            raise ValueError(f"PIDController.safety must be in (0, 1], got {self.safety}")
        if not (0 < self.factor_min < 1 < self.factor_max):
            raise ValueError("PIDController needs 0 < factor_min < 1 < factor_max, got "
                             f"{self.factor_min}, {self.factor_max}")

"""The raised CLASS precision every reference in tests/data is made with (one copy, imported by
the generators): about 19 s of CPU for the massive-ν case against ~1.5 s at CLASS's defaults, and
P(k) changed by < 0.1% over 1e-3 < k < 1 h/Mpc."""

PRECISION_CLASS = {
    "k_per_decade_for_pk": 50, "k_per_decade_for_bao": 200,
    "tol_perturbations_integration": 1e-6, "perturbations_sampling_stepsize": 0.05,
    "l_max_g": 20, "l_max_pol_g": 15, "l_max_ur": 30, "l_max_ncdm": 30,
    "tol_ncdm_synchronous": 1e-5, "tol_ncdm_bg": 1e-10,
    "radiation_streaming_trigger_tau_over_tau_k": 240,
    "ur_fluid_trigger_tau_over_tau_k": 50, "ncdm_fluid_trigger_tau_over_tau_k": 51,
}

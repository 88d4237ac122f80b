"""Emitters of the generated Einstein-Boltzmann model, one per species (composed by models/eb.py).

``base``: the contract and collectors; ``background``: k and the table reads; ``metric``: the
Einstein equations; ``photons``, ``baryons_cdm``, ``massless_neutrinos``, ``massive_neutrinos``,
``dark_energy``: the species; ``hierarchy``: what the multipole hierarchies share.
"""

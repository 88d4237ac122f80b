#!/usr/bin/env python
"""Compute transfer functions, P(k) and sigma8 from a YAML config (see boltzmann/cli.py).

    python scripts/transfer.py --config configs/lcdm.yaml [--out DIR] [--compare FILE]
"""
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_ENABLE_X64", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

from boltzmann.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

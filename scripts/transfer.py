#!/usr/bin/env python
"""Compute transfer functions, P(k) and sigma8 from a YAML config (see boltzmann/cli.py).

    python scripts/transfer.py --config configs/lcdm.yaml [--out DIR] [--compare FILE]

The same job is installed as the console command ``boltzmann-transfer``.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from boltzmann.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""P(k), sigma8 and derived numbers for a table of cosmologies, into one HDF5 file
(see boltzmann/batch/ and docs/batch.md).

    python scripts/batch.py --config configs/lcdm.yaml --params params.csv --out out.h5

Resumable: rerun the same command after an interruption. The same job is installed as the
console command ``boltzmann-batch``.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from boltzmann.batch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

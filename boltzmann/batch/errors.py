"""The one error type of batch mode: a problem the user fixes by changing the command or input.

Raised before anything is computed (bad table header, unusable output file, config mismatch,
unknown device) or when a batch cannot go on (every chunk fails the same way). Problems of a
single row are never raised: they are recorded in the file.
"""
from __future__ import annotations

__all__ = ["BatchError"]


class BatchError(Exception):
    """Batch mode cannot start or continue; the message says what to change.

    exit_code: what the command returns, 2 for bad input or usage (the default), 1 for a run
    that started and could not go on.
    """

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code

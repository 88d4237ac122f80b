"""What a solve is asked and what it returns: inputs and their validation, statuses, results.

The lowest layer of the solver: every backend and entry point uses it, it uses none of them.
"""
from .inputs import (TraceableInputs, ValidatedInputs, check_options, require_x64,
                     validate_inputs, validate_traceable)
from .sensitivity_spec import SensitivitySpec
from .solution import Solution
from .status import Status, describe

__all__ = ["Solution", "Status", "describe", "ValidatedInputs", "TraceableInputs",
           "validate_inputs", "validate_traceable", "check_options", "require_x64",
           "SensitivitySpec"]

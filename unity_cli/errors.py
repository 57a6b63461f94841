"""One error hierarchy for everything a user can get wrong.

Each error carries what a person needs to fix the input (file, ONNX node, YAML field,
MPI rank) in its message; the CLI prints ``error: <message>`` and exits 1.
"""
from __future__ import annotations


class UnityError(Exception):
    """Base of every error the CLI reports as one line instead of a traceback."""


class ModelError(UnityError):
    """The ONNX file cannot be read or imported (names the file and, where known, the node)."""


class UnsupportedOpError(ModelError):
    """The model still has an op after folding that unity has no specification for."""


class ShapeError(UnityError):
    """Logical or parallel shapes do not fit an operator's rules."""


class ClusterSpecError(UnityError):
    """The cluster YAML is malformed (names the file and the field path)."""


class PlanError(UnityError):
    """A plan file is malformed, stale, or does not match the model or the ranks."""


class InfeasibleError(UnityError):
    """No plan fits the constraints (e.g. memory per device)."""


class UsageError(UnityError):
    """Bad command-line arguments (names the option)."""


class RunError(UnityError):
    """Training with a plan failed (names the MPI rank and the node where it can)."""


class ProfileError(UnityError):
    """A profile DB file is malformed or cannot be read or written (names the file and field)."""


class ReportError(UnityError):
    """A report cannot be written, or a file it shows (``--measured``) is malformed (names the file and field)."""

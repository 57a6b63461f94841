"""Substitutions: the rule format, matching and applying, the generator, the z3 verifier
and the verified rule cache."""
from __future__ import annotations

"""The phases of a training step, and the steps that belong to no graph node.

The cost model's moves and events, the runtime's byte count and the report name a step's
parts with these (a ``StrEnum``: each is its string too, so profiles and plans written with
the strings read the same).
"""
from __future__ import annotations

from enum import IntEnum, StrEnum


class Phase(StrEnum):
    """When in a step a piece of work runs: each micro-batch's forward, loss and backward,
    then the gradient sync and the optimizer's update."""

    FWD = "fwd"
    LOSS = "loss"
    BWD = "bwd"
    SYNC = "sync"
    UPDATE = "update"


MOVE_PHASES = (Phase.FWD, Phase.BWD, Phase.LOSS, Phase.SYNC)
"""The phases data moves in (the update moves none; a ZeRO all-gather is the sync's)."""


class StepNode(IntEnum):
    """The node id of a simulated event that no graph node makes."""

    UPDATE = -1      # the optimizer's update
    LOSS = -2        # gathering the output's pieces the loss needs, and the loss
    SYNC = -3        # the gradient sync's collectives

"""The autoscaler as a pure policy: no I/O, no clock, no asyncio, so the controller and the
simulator run the same code. See :mod:`dsi.autoscale.policy` for the rules and a worked example."""

from dsi.autoscale.config import AutoscalerConfig, RoleBounds
from dsi.autoscale.decision import Decision, RoleDecision, Rule
from dsi.autoscale.history import DecisionLog
from dsi.autoscale.inputs import RoleInputs, ScalingInputs
from dsi.autoscale.policy import decide
from dsi.autoscale.simulate import simulate

__all__ = [
    "AutoscalerConfig",
    "Decision",
    "DecisionLog",
    "RoleBounds",
    "RoleDecision",
    "RoleInputs",
    "Rule",
    "ScalingInputs",
    "decide",
    "simulate",
]

"""Decisions for one role (decode) with prefill idle, so each test states only what it checks."""

from __future__ import annotations

from dataclasses import replace

from dsi.autoscale import (
    AutoscalerConfig,
    Decision,
    RoleBounds,
    RoleDecision,
    RoleInputs,
    ScalingInputs,
    decide,
)

IDLE_PREFILL = RoleInputs(serving=0, capacity=1.0, demand=0.0)


def config(bounds: RoleBounds, **options: float) -> AutoscalerConfig:
    return AutoscalerConfig(prefill=RoleBounds(min_instances=0, max_instances=1), decode=bounds, **options)


def decide_decode(
    bounds: RoleBounds, *, now_s: float = 0.0, previous: Decision | None = None, **seen: float
) -> Decision:
    inputs = ScalingInputs(now_s=now_s, prefill=IDLE_PREFILL, decode=RoleInputs(**seen))
    return decide(config(bounds), inputs, previous)


def without_reasons(decision: RoleDecision) -> RoleDecision:
    return replace(decision, reasons=())

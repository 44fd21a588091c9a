"""BalancerActor: one load balancer. No policy is wired in yet, so it routes nothing (a
RouteQuery is an unknown message) and answers only the calls every role answers (Ping, Load)."""

from __future__ import annotations

from dsi.config import BalancerOptions
from dsi.roles.role import RoleActor


class BalancerActor(RoleActor):
    def __init__(self, name: str, options: BalancerOptions) -> None:
        super().__init__(name)
        self.policy = options.policy

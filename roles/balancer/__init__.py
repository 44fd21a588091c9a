"""The balancer role: prefill, decode, vision and expert-parallel load balancing (policies to come)."""

from dsi.roles.balancer.actor import BalancerActor

__all__ = ["BalancerActor"]

"""The balancer role. Planned: prefill, decode, vision and expert-parallel load balancing; today it
routes nothing (the entrypoint picks the least loaded instance itself)."""

from dsi.roles.balancer.actor import BalancerActor

__all__ = ["BalancerActor"]

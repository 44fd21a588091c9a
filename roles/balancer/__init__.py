"""The balancer role: routes prefill requests by length bucket and decode requests by load and
KV-length band, from the load the engines push (dsi.balance holds the policies)."""

from dsi.roles.balancer.actor import BalancerActor

__all__ = ["BalancerActor"]

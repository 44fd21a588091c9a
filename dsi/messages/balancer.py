"""Balancer queries: where should this request go?"""

from __future__ import annotations

from dsi.messages.base import Message


class RouteQuery(Message):
    role: str  # prefill | decode | encoder
    uncached_tokens: int = 0
    kv_tokens: int = 0
    exclude: list[str] = []  # instance ids that already failed this request


class Route(Message):
    instance_id: str
    address: str


BalancerMsg = RouteQuery | Route
BALANCER = (RouteQuery, Route)

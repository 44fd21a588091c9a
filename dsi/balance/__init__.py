"""Load-balancing policies: pure functions and small classes over snapshots of instance loads, with
no I/O, so the balancer roles and the simulator run the same code.

    prefill   length buckets by un-cached tokens, engines per bucket by measured compute
    decode    request count + KV tokens against capacity, long and short KV-length bands
    vision    least queued pixels
"""

from dsi.balance.cost import PrefillCost
from dsi.balance.decode import DecodeBalancer, DecodeBalancerConfig
from dsi.balance.load import InstanceLoad, NoInstance
from dsi.balance.prefill import PrefillBalancer, PrefillBalancerConfig
from dsi.balance.vision import route_vision

__all__ = [
    "DecodeBalancer",
    "DecodeBalancerConfig",
    "InstanceLoad",
    "NoInstance",
    "PrefillBalancer",
    "PrefillBalancerConfig",
    "PrefillCost",
    "route_vision",
]

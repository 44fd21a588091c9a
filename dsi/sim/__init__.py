"""``dsi sim``: a deterministic discrete-event simulator of a dsi cluster that runs dsi's own
policy code - the prefill length buckets and decode bands (dsi.balance), the autoscaler with its
ready pool and quota rule (dsi.autoscale), the hash chain and the TTL index (dsi.kvcache), the
hit policy (dsi.engine.hit_policy) - over a cost model per hardware profile.

    workload      SimRequest (workload), Mooncake traces (trace), generators (generators,
                  arrivals, sessions)
    cost          hardware profiles (profiles), prefill / handoff / decode step time (cost,
                  step_time)
    cluster       the event loop (cluster) over prefill and decode instances (prefill, decode),
                  page caches (cache), SWA ring snapshots (states), fleets and the autoscaler
                  (fleet, scaler)
    results       per-request records (records), the JSON summary (summary), plots (plots)
    experiments   the studies of docs/simulation.md (experiments)
    validation    the simulator against a real ``dsi serve`` of this machine: a trace slice as
                  chat requests and simulated requests (validate_slice), the served replay
                  (validate_serve), the comparison (validate)
"""

from dsi.sim.cluster import Cluster
from dsi.sim.config import SimConfig
from dsi.sim.generators import GeneratorConfig, generate
from dsi.sim.profiles import HardwareProfile, get_profile
from dsi.sim.run import simulate
from dsi.sim.trace import trace_workload
from dsi.sim.workload import SimRequest

__all__ = [
    "Cluster",
    "GeneratorConfig",
    "HardwareProfile",
    "SimConfig",
    "SimRequest",
    "generate",
    "get_profile",
    "simulate",
    "trace_workload",
]

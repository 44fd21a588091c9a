"""A live cluster page on the gateway: ``GET /dashboard``, which polls ``/dashboard/state.json``.

It shows the controller's instances (role, lifecycle state, load), the balancer's length buckets
and decode bands, the autoscaler's roles and decisions, the lifecycle transition counts, the
prefix hit rate, and TTFT / time-between-tokens charts of the last minutes. Open like /metrics
and /health (no API key).
"""

from dsi.roles.entrypoint.dashboard.routes import DASHBOARD_PATHS, add_dashboard

__all__ = ["DASHBOARD_PATHS", "add_dashboard"]

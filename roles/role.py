"""RoleActor: what every role instance has in common - a lifecycle state and a Load report.

The heartbeat task reads ``state`` and ``load()`` each interval and sends them to the controller.
Asking a role with a ``Load`` message (any values) answers its current Load, so an operator or a
test can read any role's counters without knowing its kind.

    starting --start()--> ready --stop()--> stopping
"""

from __future__ import annotations

from dsi.actor import Actor, handles
from dsi.messages.control import Load


class RoleActor(Actor):
    """Base of every role's actor. Subclasses with work to count override ``load``."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.state = "starting"

    async def on_start(self) -> None:
        self.state = "ready"

    async def on_stop(self) -> None:
        self.state = "stopping"

    def load(self) -> Load:
        """The counters the controller's table shows and its autoscaler reads (balancers get the
        engines' own LoadReport, see dsi.roles.load_report); a role with no engine runs nothing."""
        return Load(inbox=self.inbox_depth)

    @handles
    async def report_load(self, msg: Load) -> Load:
        return self.load()

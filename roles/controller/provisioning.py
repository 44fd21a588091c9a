"""ClusterFollower: the controller follows its own scale targets with the kubernetes provisioner.

    start:  adopt() the dsi pods that run now (every interval until the API answers)
    then, every interval:  the scaler's ScaleStatus, in process --> ScaleFollower round
                           --> StatefulSet scale calls
    close:  end the rounds and the client; scale nothing

A controller pod that restarts finds its instances running and keeps them: closing never scales
a StatefulSet down, and the first round after adoption starts only what is missing. An API that
fails is logged and tried again the next round; the controller keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence

from dsi.messages.control import GetScale, ScaleStatus
from dsi.provision.follow import ScaleFollower
from dsi.provision.kube_api import KubeError
from dsi.provision.kubernetes import KubernetesProvisioner

log = logging.getLogger(__name__)


class _InProcess:
    """A ScaleSource that answers from the controller's scaler without a socket."""

    def __init__(self, status: Callable[[], ScaleStatus]) -> None:
        self._status = status

    async def connect(self, timeout: float) -> None:
        return None

    async def ask(self, msg: GetScale, timeout: float) -> ScaleStatus:
        return self._status()


class ClusterFollower:
    """`declared`: the role ids of each scaled kind, in config order; `status`: the scaler's
    current ScaleStatus; `every_s`: seconds between two rounds."""

    def __init__(
        self,
        provisioner: KubernetesProvisioner,
        declared: Mapping[str, Sequence[str]],
        status: Callable[[], ScaleStatus],
        every_s: float,
    ) -> None:
        self.provisioner = provisioner
        self.every_s = every_s
        self.follower = ScaleFollower(provisioner, declared, _InProcess(status), every_s)

    async def run(self) -> None:
        await self._adopt()
        await self.follower.run()

    async def close(self) -> None:
        """Cancel the starts and stops under way and close the client; every pod keeps running."""
        await self.follower.close()
        await self.provisioner.detach()

    async def _adopt(self) -> None:
        while True:
            try:
                await self.provisioner.adopt()
                return
            except KubeError as exc:
                log.warning(
                    "autoscale: cannot read the running pods (%s); trying again in %gs", exc, self.every_s
                )
                await asyncio.sleep(self.every_s)

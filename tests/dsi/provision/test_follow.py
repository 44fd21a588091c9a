"""ScaleFollower: one round asks the controller and starts and stops what differs."""

from __future__ import annotations

import asyncio

from dsi.errors import AskTimeout
from dsi.messages.control import ScaleRole, ScaleStatus
from dsi.provision import ProvisionedInstance, ScaleFollower


class FakeProvisioner:
    def __init__(self, *running: str) -> None:
        self.states = {role_id: "ready" for role_id in running}
        self.calls: list[str] = []

    async def start(self, role_id: str) -> ProvisionedInstance:
        self.calls.append(f"start {role_id}")
        self.states[role_id] = "ready"
        return ProvisionedInstance(role_id, "ready", 1)

    async def stop(self, role_id: str) -> None:
        self.calls.append(f"stop {role_id}")
        self.states[role_id] = "stopped"

    def list(self) -> list[ProvisionedInstance]:
        return [ProvisionedInstance(role_id, state, None) for role_id, state in self.states.items()]  # type: ignore[arg-type]

    async def close(self) -> None:
        pass


class FakeController:
    def __init__(self, answer: object) -> None:
        self.answer = answer

    async def ask(self, msg: object, timeout: float | None = None) -> object:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def decode(wanted: int, stop: list[str]) -> ScaleStatus:
    role = ScaleRole(
        "decode",
        1,
        4,
        1,
        serving=1,
        ready=1,
        starting=0,
        draining=len(stop),
        target=1,
        pool_target=1,
        wanted=wanted,
        stop=stop,
    )
    return ScaleStatus(True, 1.0, 0.8, [role])


async def step(provisioner: FakeProvisioner, answer: object) -> list[str]:
    declared = {"decode": ["decode-0", "decode-1", "decode-2", "decode-3"]}
    follower = ScaleFollower(provisioner, declared, FakeController(answer), 0.1)  # type: ignore[arg-type]
    await follower.step()
    await asyncio.sleep(0)  # the starts and stops run as tasks
    await follower.close()
    return provisioner.calls


async def test_a_round_starts_up_to_wanted_and_stops_the_named():
    assert await step(FakeProvisioner("decode-0", "decode-1"), decode(3, [])) == ["start decode-2"]
    assert await step(FakeProvisioner("decode-0", "decode-1", "decode-2"), decode(2, ["decode-2"])) == [
        "stop decode-2"
    ]


async def test_nothing_changes_while_the_controller_is_away_or_autoscaling_is_off():
    assert await step(FakeProvisioner("decode-0"), AskTimeout("no answer")) == []
    assert await step(FakeProvisioner("decode-0"), ScaleStatus(enabled=False)) == []

"""InstanceRegistry: what the controller knows about every role instance, from heartbeats alone.

Pure bookkeeping, no I/O: every method takes ``now`` (monotonic seconds), so the controller, the
simulator and the tests drive it with whatever clock they have.

State of an instance, from the age of its last heartbeat (``interval`` = heartbeat_interval_s)::

    heartbeat                                  Goodbye
        |                                         |
        v   age < 2.5 x interval    age < timeout v
    [reported state] ---------> suspect ----------> lost ---(forget_after_s)---> pruned
        |                                                                          ^
        +---------------------------- Goodbye --> stopped ---(forget_after_s)-----+

A heartbeat from a stopped or lost instance id registers it again, and so does one from another
process under a known id (a replacement that came back before the old one was found lost).
"""

from __future__ import annotations

from dataclasses import dataclass

from dsi.messages.control import Heartbeat, InstanceInfo

SUSPECT_AFTER_INTERVALS = 2.5  # two missed heartbeats, with slack for scheduling jitter


@dataclass(slots=True)
class _Entry:
    beat: Heartbeat
    seen_at: float  # monotonic seconds of the last heartbeat
    stopped_at: float | None = None  # monotonic seconds of the Goodbye


class InstanceRegistry:
    """Instances by id. `interval_s`, `timeout_s`, `forget_after_s` are seconds.

    timeout_s: an instance silent this long is ``lost``.
    forget_after_s: how long ``stopped`` and ``lost`` entries stay listed before they are pruned.
    """

    def __init__(self, interval_s: float, timeout_s: float, forget_after_s: float = 60.0) -> None:
        if not 0 < interval_s < timeout_s:
            raise ValueError(f"need 0 < interval_s < timeout_s, got {interval_s} and {timeout_s}")
        if forget_after_s <= 0:
            raise ValueError(f"forget_after_s must be > 0, got {forget_after_s}")
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.forget_after_s = forget_after_s
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def heartbeat(self, beat: Heartbeat, now: float) -> bool:
        """Record a heartbeat; True when it (re)registers the instance."""
        entry = self._entries.get(beat.instance_id)
        fresh = (
            entry is None
            or entry.stopped_at is not None
            or self._age(entry, now) >= self.timeout_s
            or _restarted(entry.beat, beat)
        )
        self._entries[beat.instance_id] = _Entry(beat, now)
        return fresh

    def goodbye(self, instance_id: str, now: float) -> bool:
        """Mark an instance stopped; False when it is unknown (nothing to mark)."""
        entry = self._entries.get(instance_id)
        if entry is None:
            return False
        if entry.stopped_at is None:
            entry.stopped_at = now
        return True

    def state(self, instance_id: str, now: float) -> str:
        """The state of one instance (KeyError when unknown)."""
        return self._state(self._entries[instance_id], now)

    def instances(self, now: float, role: str = "") -> list[InstanceInfo]:
        """Every instance (of `role`, or all when ""), sorted by id."""
        return [
            self._info(entry, now)
            for _, entry in sorted(self._entries.items())
            if not role or entry.beat.role == role
        ]

    def prune(self, now: float) -> list[str]:
        """Forget stopped and lost instances older than forget_after_s; the ids removed."""
        gone = [iid for iid, entry in self._entries.items() if self._expired(entry, now)]
        for iid in gone:
            del self._entries[iid]
        return gone

    # ---- internals ---------------------------------------------------------------------------
    @staticmethod
    def _age(entry: _Entry, now: float) -> float:
        return max(0.0, now - entry.seen_at)

    def _state(self, entry: _Entry, now: float) -> str:
        if entry.stopped_at is not None:
            return "stopped"
        age = self._age(entry, now)
        if age >= self.timeout_s:
            return "lost"
        if age >= SUSPECT_AFTER_INTERVALS * self.interval_s:
            return "suspect"
        return entry.beat.state

    def _expired(self, entry: _Entry, now: float) -> bool:
        if entry.stopped_at is not None:
            return now - entry.stopped_at >= self.forget_after_s
        return self._age(entry, now) >= self.timeout_s + self.forget_after_s

    def _info(self, entry: _Entry, now: float) -> InstanceInfo:
        beat = entry.beat
        return InstanceInfo(
            instance_id=beat.instance_id,
            role=beat.role,
            host=beat.host,
            pid=beat.pid,
            address=beat.address,
            state=self._state(entry, now),
            load=beat.load,
            last_seen_s=self._age(entry, now),
            started_at=beat.started_at,
            http=beat.http,
        )


def _restarted(before: Heartbeat, now: Heartbeat) -> bool:
    """Whether two heartbeats of one instance id come from different processes."""
    return (before.host, before.pid, before.started_at) != (now.host, now.pid, now.started_at)

"""WorkerSeat: one HTTP worker's place among the ``http_workers`` of its entrypoint role.

The role's process (worker 0) makes the seats when it starts: it reads the API keys once and
creates their shared slot table (dsi.roles.entrypoint.key_slots), and draws a fresh tag that
names the workers' metrics sockets (dsi.roles.entrypoint.worker_link). Each worker process gets
its seat with its start (pickled), so a worker started again takes the same keys and table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dsi.roles.entrypoint.auth import KeyEntry


@dataclass(frozen=True, slots=True)
class WorkerSeat:
    index: int  # 0: the role's own process; 1 .. count - 1: its worker processes
    count: int  # http_workers
    tag: str  # unique per role start (its pid and random hex)
    slots_file: str  # the /dev/shm name of the key slot table
    keys: tuple[KeyEntry, ...]  # the API keys as the role read them, in file order
    open_access: bool  # no keys file: one anonymous key

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"worker index {self.index} is not in 0..{self.count - 1}")

    def address(self, index: int) -> str:
        """The abstract unix socket worker ``index`` answers metrics asks on."""
        return f"\0dsi-http-{self.tag}-{index}"

    def at(self, index: int) -> WorkerSeat:
        return replace(self, index=index)

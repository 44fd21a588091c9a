"""A stand-in for dsi-role in the provisioner tests: prints READY, then waits for SIGTERM.

    python fake_role.py ROLE_ID MODE EVENTS_FILE

MODE: ``serve`` runs until SIGTERM; ``exit`` exits with status 0 right after READY (a retired
instance); ``crash`` exits with status 1 right after READY; ``once`` serves on its first
run and exits with status 1 before READY on every later one; ``ignore-term`` ignores SIGTERM;
``silent`` never prints READY; ``shm`` serves with a /dev/shm file it created
(``HostBuffer.create``, prefix ``dsi-fakerole``) that it never unlinks.
Each SIGTERM it obeys appends ``stopped ROLE_ID`` to EVENTS_FILE.
"""

import signal
import sys
from pathlib import Path

role_id, mode, events = sys.argv[1], sys.argv[2], Path(sys.argv[3])


def on_term(*_args: object) -> None:
    if mode == "ignore-term":
        return
    with events.open("a") as out:
        out.write(f"stopped {role_id}\n")
    sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
marker = events.with_name(f"{role_id}.started")
if mode == "once" and marker.exists():
    sys.exit(1)
marker.touch()
if mode == "shm":
    from dsi.kvcache.shm import HostBuffer

    buffer = HostBuffer.create(8192, prefix="dsi-fakerole")
    buffer.numpy()[:] = 1
if mode != "silent":
    print(f"READY {role_id}", flush=True)
if mode == "exit":
    sys.exit(0)
if mode == "crash":
    sys.exit(1)
while True:
    signal.pause()

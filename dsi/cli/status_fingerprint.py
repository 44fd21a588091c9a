"""The machine-fingerprint part of ``dsi status``: each engine instance's fingerprint (see
dsi.engine.fingerprint), and a warning for each role whose serving instances compute apart.

    warning: serving decode instances have different machine fingerprints: decode-0 3fa9c2d1,
    decode-1 77ab0e12 (differ in isa, threads); exact decode failover and exact prefix hits with
    a pulled SWA state cannot hold between them

Only serving instances that report a fingerprint are compared (an instance of an older version
reports none).
"""

from __future__ import annotations

from typing import Any

import msgspec

from dsi.messages.control import InstanceInfo
from dsi.messages.fingerprint import MachineFingerprint


def fingerprint_cell(info: InstanceInfo) -> str:
    """The table's FINGERPRINT cell: short digest and ISA summary, "-" when none is reported."""
    return info.fingerprint.short() if info.fingerprint is not None else "-"


def fingerprint_json(fp: MachineFingerprint | None) -> dict[str, Any] | None:
    """Every field of a fingerprint as plain JSON objects (None when there is none)."""
    if fp is None:
        return None
    fields = msgspec.structs.asdict(fp)
    fields["isa"] = list(fp.isa)
    return fields


def fingerprint_warnings(instances: list[InstanceInfo]) -> list[str]:
    """One line per role whose serving instances report more than one fingerprint digest."""
    by_role: dict[str, list[tuple[str, MachineFingerprint]]] = {}
    for info in instances:
        if info.state == "serving" and info.fingerprint is not None:
            by_role.setdefault(info.role, []).append((info.instance_id, info.fingerprint))
    return [
        _warning(role, prints)
        for role, prints in sorted(by_role.items())
        if len({fp.digest for _, fp in prints}) > 1
    ]


def _warning(role: str, prints: list[tuple[str, MachineFingerprint]]) -> str:
    first = prints[0][1]
    fields: list[str] = []
    for _, fp in prints[1:]:
        fields += [name for name in first.differences(fp) if name not in fields]
    who = ", ".join(f"{instance_id} {fp.digest[:8]}" for instance_id, fp in prints)
    return (
        f"warning: serving {role} instances have different machine fingerprints: {who} "
        f"(differ in {', '.join(fields) or 'digest only'}); exact decode failover and exact "
        f"prefix hits with a pulled SWA state cannot hold between them"
    )

"""The speculative-decoding part of ``dsi status``: each DSpark decode engine's step-time curve
(measured at its start-up) and its acceptance rate per draft position so far.

    decode-0 speculative dspark, accepted per draft position: 0.62 0.48 0.41 - -
      ms per step  tokens/seq:     1      2      3      4      6   draft
      batch 1                   60.1   66.0   71.2   75.3   83.9    5.2
      batch 8                  ...
"""

from __future__ import annotations

from typing import Any

import msgspec

from dsi.messages.control import InstanceInfo


def speculating(instances: list[InstanceInfo]) -> list[InstanceInfo]:
    return [i for i in instances if i.load.speculative]


def format_curves(instances: list[InstanceInfo]) -> str:
    """A block per speculating instance (its curve when it measured one)."""
    blocks = []
    for info in speculating(instances):
        load = info.load
        rates = " ".join("-" if r < 0 else f"{r:.2f}" for r in load.accept_rates)
        lines = [f"{info.instance_id} speculative {load.speculative}, accepted per draft position: {rates}"]
        c = load.step_curve
        if c is not None:
            lines.append("  ms per step  tokens/seq:" + "".join(f"{n:>7}" for n in c.lengths) + "   draft")
            for b, row, d in zip(c.batches, c.step_ms, c.draft_ms, strict=True):
                lines.append(f"  batch {b:<20}" + "".join(f"{ms:7.1f}" for ms in row) + f"{d:8.1f}")
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


def load_json(load: Any) -> dict[str, Any]:
    """An instance's Load as plain JSON objects (the curve as an object, rates as a list)."""
    fields = msgspec.structs.asdict(load)
    curve = fields.get("step_curve")
    fields["step_curve"] = msgspec.structs.asdict(curve) if curve is not None else None
    fields["accept_rates"] = list(fields.get("accept_rates", ()))
    return fields

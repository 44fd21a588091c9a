"""PNG plots of an experiment's result, with matplotlib when it is importable (it is not one of
dsi's dependencies: without it, :func:`available` is False and nothing is drawn).

    ttl          hit rate per day, one line per variant
    autoscale    serving instances per role over time, one panel per variant
    others       the experiment's headline figures as bars, one group per variant
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

BARS = {
    "prefill-lb": (("TTFT p50 s", ("ttft_s", "p50")), ("TTFT p99 s", ("ttft_s", "p99"))),
    "decode-lb": (("TBT p50 s", ("tbt_s", "p50")), ("TBT p99 s", ("tbt_s", "p99"))),
    "cache": (("hit rate", ("hit_rate",)), ("TTFT p99 s", ("ttft_s", "p99"))),
    "replay": (("prefill PFLOP", ("prefill", "pflops")), ("hit rate", ("hit_rate",))),
}


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def plot(result: dict, out_dir: Path) -> list[Path]:
    """Draw ``result`` (``dsi.sim.experiments.run_experiment``) into ``out_dir``; the files made."""
    if not available():
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    name = result["experiment"]
    path = out_dir / f"{result['letter']}_{name}.png"
    if name == "ttl":
        fig = _ttl(plt, result)
    elif name == "autoscale":
        fig = _autoscale(plt, result)
    else:
        fig = _bars(plt, result, BARS.get(name, BARS["prefill-lb"]))
    fig.suptitle(f"({result['letter']}) {result['title']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def _ttl(plt, result: dict):
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for v in result["variants"]:
        days = v["summary"]["hit_rate_by_day"]
        ax.plot(range(1, len(days) + 1), days, marker="o", markersize=3, label=v["name"])
    ax.set_xlabel("day")
    ax.set_ylabel("hit rate (hit / prompt tokens)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def _autoscale(plt, result: dict):
    variants = result["variants"]
    fig, axes = plt.subplots(len(variants), 1, figsize=(7, 1.9 * len(variants)), sharex=True)
    for ax, v in zip(axes, variants, strict=True):
        series = v["summary"]["series"]
        hours = [t / 3600 for t in series["t_s"]]
        ax.step(hours, [c[0] for c in series["prefill"]], where="post", label="prefill serving")
        ax.step(hours, [c[0] for c in series["decode"]], where="post", label="decode serving")
        ax.step(
            hours, [c[0] + c[1] + c[2] for c in series["decode"]], where="post", ls=":", label="decode held"
        )
        twin = ax.twinx()
        twin.plot(hours, series["active"], color="grey", alpha=0.4, lw=0.8)
        twin.set_ylabel("active requests", fontsize=7)
        ax.set_title(v["name"], fontsize=8)
        ax.set_ylabel("instances", fontsize=7)
    axes[0].legend(fontsize=6, loc="upper left")
    axes[-1].set_xlabel("hours")
    return fig


def _bars(plt, result: dict, figures: tuple):
    names = [v["name"] for v in result["variants"]]
    fig, axes = plt.subplots(1, len(figures), figsize=(4.2 * len(figures), 0.45 * len(names) + 1.8))
    for ax, (label, path) in zip(axes, figures, strict=True):
        values = [_get(v["summary"], path) or 0.0 for v in result["variants"]]
        ax.barh(range(len(names)), values)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(label, fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    return fig


def _get(summary: dict, path: tuple[str, ...]) -> float | None:
    value: object = summary
    for key in path:
        value = value[key]  # type: ignore[index]
    return value  # type: ignore[return-value]

"""The comparison as a table (Markdown) and plots (PNG, matplotlib's Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

COLUMNS = [
    ("goodput", "goodput"),
    ("step_time_variation", "step-time variation"),
    ("gpu_h_lost", "GPU-h lost"),
    ("mitigation_median_s", "fault to mitigation, median s"),
    ("drains", "drains"),
    ("false_drains", "false drains"),
    ("lemon_drains", "of them lemons"),
    ("requeues", "requeues"),
    ("refused", "refused by the door"),
    ("skipped", "past the hourly cap"),
    ("nodes_out_of_service", "nodes out of service"),
]

# What fabric localisation buys, today's node-only controller beside the fabric-aware one.
FABRIC_COLUMNS = [
    ("goodput", "goodput"),
    ("gpu_h_lost", "GPU-h lost"),
    ("gpu_h_lost_to_fabric", "of them to fabric faults"),
    ("false_drains", "false drains"),
    ("false_quarantines", "healthy nodes quarantined"),
    ("false_sweeps", "healthy nodes swept"),
    ("healthy_held_gpu_h", "healthy GPU-h held out"),
    ("localised", "fabric faults named"),
    ("localise_median_s", "onset to name, median s"),
    ("misnamed", "components misnamed"),
    ("drains", "drains"),
    ("requeues", "requeues"),
]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and abs(value) < 10:
        return f"{value:.3f}"
    return f"{value:.0f}" if isinstance(value, float) else str(value)


def table(result: dict[str, Any]) -> str:
    """One row per policy: the means over the seeds (the fabric figures for a fabric run)."""
    columns = FABRIC_COLUMNS if result.get("fabric") else COLUMNS
    head = "| policy | " + " | ".join(title for _, title in columns) + " |"
    rows = [head, "|" + "---|" * (len(columns) + 1)]
    for name, data in result["policies"].items():
        rows.append(f"| {name} | " + " | ".join(_cell(data["mean"][k]) for k, _ in columns) + " |")
    return "\n".join(rows)


def sensitivity_table(cases: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Goodput (and false drains, summed over the seeds: a mean of 0.333 must not print as 0) of
    every policy in each case, and which policy wins."""
    names = list(cases[0][1]["policies"])
    rows = ["| case | " + " | ".join(names) + " | best |", "|" + "---|" * (len(names) + 2)]
    for label, result in cases:
        means = {n: result["policies"][n]["mean"] for n in names}
        fds = {n: sum(r["false_drains"] for r in result["policies"][n]["runs"]) for n in names}
        best = max(names, key=lambda n: means[n]["goodput"])
        rows.append(
            f"| {label} | "
            + " | ".join(f"{means[n]['goodput']:.3f} ({fds[n]} fd)" for n in names)
            + f" | {best} |"
        )
    return "\n".join(rows)


def write(
    result: dict[str, Any], out: Path, cases: Sequence[tuple[str, dict[str, Any]]] = ()
) -> list[Path]:
    """table.md, result figures as PNG plots, under *out*; the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    text = table(result) + "\n"
    if cases:
        text += "\n" + sensitivity_table(cases) + "\n"
    written = [out / "table.md"]
    written[0].write_text(text, encoding="utf-8")
    names = list(result["policies"])
    for key, title in (
        ("goodput", "goodput against the fault-free run"),
        ("step_time_variation", "large jobs' step-time variation"),
        ("gpu_h_lost", "GPU-hours lost"),
        ("nodes_out_of_service", "nodes out of service (mean)"),
    ):
        fig, ax = plt.subplots(figsize=(5, 3.2))
        values = [result["policies"][n]["mean"][key] or 0.0 for n in names]
        ax.bar(names, values, color=["#999999", "#6f8fb3", "#d9a441", "#3c8d5a"][: len(names)])
        for run in range(len(result["seeds"])):
            ax.scatter(
                names,
                [result["policies"][n]["runs"][run][key] or 0.0 for n in names],
                color="black",
                s=8,
                zorder=3,
            )
        ax.set_title(title)
        fig.tight_layout()
        path = out / f"{key}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written

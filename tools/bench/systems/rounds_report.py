"""The interleaved-rounds report of one workload (rounds.py's statistics) as markdown and JSON:
per-system medians with spreads, every Cleave ÷ peer ratio's median and spread, goodput at
each SLO pair, and CPU ms per generated token by process role."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tools.bench.systems.catalog import (
    CLEAVE_NIXL_PROGRESS_DELAY_US,
    VLLM_NIXL_PROGRESS_DELAY_US,
    ServingSettings,
)
from tools.bench.systems.rounds import (
    SloPair,
    Spread,
    cpu_spreads,
    metric_spreads,
    ratio_spreads,
)
from tools.bench.systems.tables import METRICS, SystemOutcome


def _cell(value: Spread | None, digits: int = 1) -> str:
    return "–" if value is None else value.cell(digits)


def markdown(
    workload: str,
    rounds: Sequence[Sequence[SystemOutcome]],
    orders: Sequence[Sequence[str]],
    slo_pairs: Sequence[SloPair],
    notes: Sequence[str] = (),
) -> str:
    metrics = metric_spreads(rounds)
    lines = [
        f"# {workload}: {len(rounds)} interleaved rounds",
        "",
        "Every system ran once per round, the order rotated each round: "
        + "; ".join(f"round {i + 1}: {', '.join(order)}" for i, order in enumerate(orders))
        + ". Cells: median [min–max] over the rounds. One round's own numbers: the per-round"
        " reports (`round-N/`).",
        "",
        *notes,
        "",
        "## Results",
        "",
    ]
    header = ["system", *(m.label for m in METRICS)]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for system, values in metrics.items():
        cells = [system, *(_cell(values.get(m.key), 2 if m.higher_is_better else 1) for m in METRICS)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Goodput (completed req/s meeting both objectives of a pair)", ""]
    header = ["system", *(p.label for p in slo_pairs)]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for system, values in metrics.items():
        lines.append("| " + " | ".join([system, *(_cell(values.get(p.key), 3) for p in slo_pairs)]) + " |")
    lines += [
        "",
        "## Ratios",
        "",
        "Cleave ÷ peer within each round, then median [min–max]: below 1 is better for latencies, above"
        " 1 for throughput.",
        "",
    ]
    found = ratio_spreads(rounds)
    pairs = list(dict.fromkeys((r.system, r.peer) for r in found))
    if not pairs:
        lines.append("(no Cleave system and peer both ran)")
    else:
        by_key = {(r.system, r.peer, r.metric): r for r in found}
        header = ["Cleave ÷ peer", *(m.label for m in METRICS)]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for system, peer in pairs:
            cells = [f"{system} ÷ {peer}", *(_cell(by_key[(system, peer, m.key)].spread, 2) for m in METRICS)]
            lines.append("| " + " | ".join(cells) + " |")
    cpu = cpu_spreads(rounds)
    lines += [
        "",
        "## CPU per generated token (ms), by process",
        "",
        "utime + stime of every process of the system over the measured run, from /proc"
        " (tools/bench/proc_cpu.py), ÷ output tokens; `serving` = all but the engine (vLLM's EngineCore"
        " and model runner).",
        "",
    ]
    if not cpu:
        lines.append("(not measured)")
    else:
        roles = list(dict.fromkeys(role for per in cpu.values() for role in per))
        roles.sort(key=lambda r: (r == "serving", r == "engine", r))
        lines += ["| system | " + " | ".join(roles) + " |", "|" + "---|" * (len(roles) + 1)]
        for system, per in cpu.items():
            lines.append("| " + " | ".join([system, *(_cell(per.get(role), 2) for role in roles)]) + " |")
    return "\n".join(lines) + "\n"


def _spread_json(value: Spread | None) -> dict[str, Any] | None:
    return None if value is None else dataclasses.asdict(value)


def to_json(
    workload: str,
    rounds: Sequence[Sequence[SystemOutcome]],
    orders: Sequence[Sequence[str]],
    slo_pairs: Sequence[SloPair],
) -> dict[str, Any]:
    return {
        "workload": workload,
        "rounds": len(rounds),
        "orders": [list(o) for o in orders],
        "slo_pairs": [{"key": p.key, **dataclasses.asdict(p)} for p in slo_pairs],
        "metrics": {
            system: {key: _spread_json(s) for key, s in values.items()}
            for system, values in metric_spreads(rounds).items()
        },
        "ratios": [
            {
                "system": r.system,
                "peer": r.peer,
                "metric": r.metric,
                "spread": _spread_json(r.spread),
                "per_round": list(r.values),
            }
            for r in ratio_spreads(rounds)
        ],
        "cpu_ms_per_token": {
            system: {role: _spread_json(s) for role, s in per.items()}
            for system, per in cpu_spreads(rounds).items()
        },
    }


def nixl_note(settings: ServingSettings) -> str:
    """What the report says about NIXL's progress thread in vllm-pd and in Cleave."""
    vllm_pd = (
        "vLLM's NixlConnector as shipped (nixl's Python agent sets pthrDelay = 0: busy polling)"
        if settings.vllm_pd_progress_delay_us is None
        else f"a {settings.vllm_pd_progress_delay_us} us poll interval (Cleave's NixlConnector subclass)"
    )
    return (
        f"NIXL progress thread: vllm-pd (when compared) runs with {vllm_pd}; Cleave's workers poll every"
        f" {CLEAVE_NIXL_PROGRESS_DELAY_US} us (--nixl-progress-delay-us). vLLM's default is"
        f" {VLLM_NIXL_PROGRESS_DELAY_US} us, busy polling (`--vllm-pd-progress-delay-us 0` runs it)."
    )


def write(
    out_dir: Path,
    rounds: Mapping[str, Sequence[Sequence[SystemOutcome]]],
    orders: Sequence[Sequence[str]],
    slo_pairs: Sequence[SloPair],
    notes: Sequence[str] = (),
) -> list[Path]:
    """<workload>.rounds.md and .json for every workload."""
    written = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for workload, per_round in rounds.items():
        md = out_dir / f"{workload}.rounds.md"
        md.write_text(markdown(workload, per_round, orders, slo_pairs, notes))
        data = to_json(workload, per_round, orders, slo_pairs)
        js = out_dir / f"{workload}.rounds.json"
        js.write_text(json.dumps(data, indent=2) + "\n")
        written += [md, js]
    return written

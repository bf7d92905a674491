"""GuideLLM as compare's cross-check: its venv (made once per lock) and one run of a workload."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from libs.stack.process import log_tail
from tools.bench.systems import guidellm
from tools.bench.systems.catalog import SystemPlan
from tools.bench.systems.presets import CompareSizes


@dataclass(frozen=True)
class GuidellmOptions:
    venv: Path
    lock: Path
    find_links: tuple[str, ...]
    timeout_s: float


def ensure_guidellm(options: GuidellmOptions, log_path: Path) -> None:
    """Creates the GuideLLM venv from its lock unless it was made from this very lock."""
    if guidellm.venv_is_current(options.venv, options.lock):
        print(f"compare: reusing GuideLLM venv {options.venv}", file=sys.stderr)
        return
    print(f"compare: installing GuideLLM into {options.venv} (log: {log_path})", file=sys.stderr, flush=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        for command in guidellm.install_commands(
            options.venv, options.lock, sys.executable, options.find_links
        ):
            code = subprocess.run(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=guidellm.isolated_environment(),
                check=False,
            ).returncode
            if code != 0:
                raise RuntimeError(f"{' '.join(command[:4])} ... failed ({code}):\n{log_tail(log_path)}")
    guidellm.write_stamp(options.venv, options.lock)


async def run_guidellm(
    options: GuidellmOptions,
    plan: SystemPlan,
    workload: str,
    *,
    out_dir: Path,
    sizes: CompareSizes,
    served_name: str,
    model_path: Path,
) -> guidellm.GuidellmOutcome:
    """GuideLLM's own run of `workload` against `plan` (the cross-check of tools/bench's numbers)."""
    folder = out_dir / "guidellm"
    folder.mkdir(parents=True, exist_ok=True)
    scenario_path = folder / f"{plan.name}-{workload}.scenario.json"
    report_path = folder / f"{plan.name}-{workload}.json"
    log_path = out_dir / "logs" / plan.name / f"guidellm-{workload}.log"
    report_path.unlink(missing_ok=True)
    spec = guidellm.scenario(
        workload,
        sizes,
        target=plan.base_url,
        model=served_name,
        tokenizer=model_path,
        output_json=report_path,
    )
    scenario_path.write_text(json.dumps(spec, indent=2) + "\n")
    command = guidellm.run_command(options.venv, scenario_path)
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=guidellm.isolated_environment(),
            start_new_session=True,
        )
        try:
            code = await asyncio.wait_for(process.wait(), options.timeout_s)
        except TimeoutError:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            error = f"GuideLLM did not finish in {options.timeout_s:.0f}s; see {log_path}"
            return guidellm.GuidellmOutcome(None, error, report_path, log_path)
    if code != 0:
        error = f"GuideLLM exited with {code}; last lines of {log_path}:\n{log_tail(log_path, 15)}"
        return guidellm.GuidellmOutcome(None, error, report_path, log_path)
    try:
        return guidellm.GuidellmOutcome(guidellm.load_report(report_path), None, report_path, log_path)
    except guidellm.ReportError as exc:
        return guidellm.GuidellmOutcome(None, str(exc), report_path, log_path)

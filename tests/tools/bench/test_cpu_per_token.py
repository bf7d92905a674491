"""tools/bench/cpu_per_token's report: per-token CPU by role, idle CPU subtracted, paired ratios."""

from __future__ import annotations

import json
from pathlib import Path

from tools.bench.cpu_per_token import Measurement, load, markdown


def _measurement(system: str, round_: int, serving: dict[str, float]) -> Measurement:
    return Measurement(
        round=round_,
        system=system,
        concurrency=4,
        tokens=1000,
        duration_s=10.0,
        cpu_s={**serving, "engine": 30.0},
        idle_cpu_per_s={name: 0.01 for name in serving},
    )


def test_per_token_cpu_idle_subtracted_and_ratios_to_vllm_of_the_same_round(tmp_path: Path) -> None:
    runs = [
        _measurement("vllm", 1, {"api-server": 0.3}),
        _measurement("cleave-pd", 1, {"gateway": 0.3, "tokenizer": 0.1, "worker": 0.2}),
        _measurement("vllm", 2, {"api-server": 0.6}),
        _measurement("cleave-pd", 2, {"gateway": 0.3, "tokenizer": 0.1, "worker": 0.2}),
    ]
    cleave = runs[1]
    assert abs(cleave.ms_per_token()["serving layer"] - 0.6) < 1e-9  # engine left out
    # 0.6 s less 3 roles x 0.01 s/s x 10 s idle, over 1000 tokens.
    assert abs(cleave.serving_work_ms_per_token() - 0.3) < 1e-9
    path = tmp_path / "cpu_per_token.json"
    path.write_text(json.dumps([dict(vars(m)) for m in runs]))
    table = markdown(load([path]), [4])
    row = next(line for line in table.splitlines() if line.startswith("| cleave-pd | 4 |"))
    # Serving ÷ vLLM's api-server per round: 2.0 and 1.0, median 1.5.
    assert "| 1.500 (1.000–2.000) |" in row


def test_labelled_runs_are_paired_with_vllm_of_the_same_label(tmp_path: Path) -> None:
    # `--label before|after` renames every system ("vllm (before)"); the ratios must still pair
    # each Cleave run with vLLM of its own build and round, not come out empty.
    runs = [
        _measurement("vllm (before)", 1, {"api-server": 0.3}),
        _measurement("cleave-pd (before)", 1, {"gateway": 0.6}),
        _measurement("vllm (after)", 1, {"api-server": 0.6}),
        _measurement("cleave-pd (after)", 1, {"gateway": 0.3}),
    ]
    path = tmp_path / "cpu_per_token.json"
    path.write_text(json.dumps([dict(vars(m)) for m in runs]))
    table = markdown(load([path]), [4])
    before = next(line for line in table.splitlines() if line.startswith("| cleave-pd (before) | 4 |"))
    after = next(line for line in table.splitlines() if line.startswith("| cleave-pd (after) | 4 |"))
    assert "| 2.000 (2.000–2.000) |" in before
    assert "| 0.500 (0.500–0.500) |" in after

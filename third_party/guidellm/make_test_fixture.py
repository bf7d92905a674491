"""Writes testdata/report_v2_trimmed.json with GuideLLM's own models (run in a GuideLLM venv).

The fixture is a GuideLLM 0.8.1 JSON report (GenerativeBenchmarksReport, schema version 2)
trimmed to the fields Cleave's comparison reads: the metadata, the scenario it ran, and per
benchmark the request totals and the TTFT / ITL distributions. Every object is built and
serialized by GuideLLM's pydantic models, so the shape is the one `guidellm run` writes.

    ~/.cache/cleave/guidellm-venv/bin/python third_party/guidellm/make_test_fixture.py
"""

import json
import sys
import tempfile
from pathlib import Path

from guidellm.benchmark.schemas.report import GenerativeBenchmarkMetadata
from guidellm.schemas import StatusBreakdown
from guidellm.schemas.base.statistics import StatusDistributionSummary
from guidellm.schemas.benchmark.entrypoints import BenchmarkScenario

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[1]))
from tools.bench.systems.guidellm import scenario  # noqa: E402
from tools.bench.systems.presets import CompareSizes  # noqa: E402

with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "scenario.json"
    spec = scenario(
        "short-chat",
        CompareSizes(),
        target="http://127.0.0.1:8000",
        model="smollm2",
        tokenizer=Path("/models/smollm2"),
        output_json=Path("/results/short-chat.json"),
    )
    path.write_text(json.dumps(spec))
    config = BenchmarkScenario.create(scenario=path)

# Four successful requests, one errored (63 gaps each: 64 output tokens).
ttft = StatusDistributionSummary.from_values(successful=[100.0, 120.0, 140.0, 400.0], incomplete=[], errored=[900.0])
itl = StatusDistributionSummary.from_values(
    successful=[(20.0, 63.0), (22.0, 63.0), (25.0, 63.0), (30.0, 63.0)], incomplete=[], errored=[]
)
report = {
    "metadata": GenerativeBenchmarkMetadata().model_dump(mode="json"),
    "config": config.model_dump(mode="json"),
    "benchmarks": [
        {
            "type_": "generative_benchmark",
            "metrics": {
                "request_totals": StatusBreakdown[int, int, int, int](
                    successful=4, errored=1, incomplete=0, total=5
                ).model_dump(mode="json"),
                "time_to_first_token_ms": ttft.model_dump(mode="json"),
                "inter_token_latency_ms": itl.model_dump(mode="json"),
            },
        }
    ],
    "conclusions": [],
}
out = here / "testdata" / "report_v2_trimmed.json"
out.write_text(json.dumps(report, indent=1) + "\n")
print(f"wrote {out}: TTFT median {ttft.successful.median}, ITL median {itl.successful.median}")

"""Starting, waiting on and stopping server processes, and the whole comparison, with fake
"systems": a tiny OpenAI-compatible server script run as a child process on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from libs.rpc.ports import free_port
from libs.stack.process import LaunchError, ProcessSpec, start, wait_ready
from libs.stack.reaper import reaper_pid
from tools.bench.compare import CompareOptions, Planner, run_comparison, warmup_config
from tools.bench.config import BenchConfig, WorkloadConfig
from tools.bench.runner import WARMUP_SEED_OFFSET, run_benchmark
from tools.bench.systems import guidellm
from tools.bench.systems.catalog import PortSource, ServingSettings, SystemPlan
from tools.bench.systems.guidellm_run import GuidellmOptions
from tools.bench.systems.presets import CompareSizes
from tools.bench.systems.scrape import HistogramProbe

pytestmark = pytest.mark.anyio

FIXTURE = Path(os.path.abspath(__file__)).parents[3] / "third_party/guidellm/testdata/report_v2_trimmed.json"

# A fake system: tests/tools/bench/fake_openai.py's server plus /health, and /metrics with a
# gateway-style prefill stage histogram observing each request's (fake) prefill time.
FAKE_SERVER = """
import sys, time
import prometheus_client, uvicorn
from starlette.responses import Response
from starlette.routing import Route
from tests.tools.bench.fake_openai import FakeOpenAI

port, ttft_s, startup_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
print("fake system loading", flush=True)
time.sleep(startup_s)
stage = prometheus_client.Histogram("cleave_gateway_stage_seconds", "stage", ["stage"])

class Fake(FakeOpenAI):
    async def _complete(self, request):
        stage.labels("prefill").observe(self.ttft_s)
        return await super()._complete(request)

async def health(request):
    return Response(status_code=200)

async def metrics(request):
    return Response(prometheus_client.generate_latest(), media_type="text/plain")

app = Fake(ttft_s=ttft_s, itl_s=0.002).app()
app.router.routes += [Route("/health", health), Route("/metrics", metrics)]
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""

# A fake GuideLLM: copies the fixture report to where the scenario asks for it.
FAKE_GUIDELLM = """#!{python}
import json, shutil, sys
scenario = json.load(open(sys.argv[sys.argv.index("--scenario") + 1]))
assert sys.argv[1] == "run", sys.argv
print("fake guidellm", scenario["spec"]["backend"]["target"], scenario["spec"]["profile"]["kind"])
shutil.copy({fixture!r}, scenario["spec"]["outputs"][0]["path"])
"""


@pytest.fixture
def server_script(tmp_path: Path) -> Path:
    path = tmp_path / "fake_system.py"
    path.write_text(FAKE_SERVER)
    return path


def fake_spec(
    name: str, script: Path, port: int, ttft_s: float = 0.01, startup_s: float = 0.0
) -> ProcessSpec:
    return ProcessSpec(
        name,
        (sys.executable, str(script), str(port), str(ttft_s), str(startup_s)),
        {},
        f"http://127.0.0.1:{port}/health",
    )


def port_closed(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def test_a_fake_system_starts_serves_and_stops(server_script: Path, tmp_path: Path) -> None:
    port = free_port()
    process = start(fake_spec("fake", server_script, port, startup_s=1.0), tmp_path / "logs")
    try:
        # Not listening during its "model load": readiness waits instead of failing.
        took = await wait_ready([process], timeout_s=60, poll_s=0.2)
        assert took >= 1.0
        assert os.getpgid(process.pid) == process.pid  # its own process group
        config = BenchConfig(
            url=f"http://127.0.0.1:{port}", model="fake-model", api="chat",
            workload=WorkloadConfig(input_len=5, output_len=3), num_requests=3, concurrency=2,
        )  # fmt: skip
        result = await run_benchmark(config)
        assert result.summary.completed == 3
    finally:
        process.stop(timeout_s=20)
    assert process.process.poll() is not None and port_closed(port)
    assert "fake system loading" in (tmp_path / "logs" / "fake.log").read_text()


async def test_a_server_that_exits_while_starting_shows_its_log(tmp_path: Path) -> None:
    spec = ProcessSpec(
        "broken", (sys.executable, "-c", "print('error: unknown flag --bogus'); raise SystemExit(3)"), {},
        f"http://127.0.0.1:{free_port()}/health",
    )  # fmt: skip
    process = start(spec, tmp_path)
    with pytest.raises(LaunchError) as error:
        await wait_ready([process], timeout_s=60, poll_s=0.1)
    message = str(error.value)
    assert message.startswith("broken exited with code 3 while starting")
    assert "error: unknown flag --bogus" in message and str(tmp_path / "broken.log") in message
    process.stop(timeout_s=5)


async def test_a_server_that_never_gets_ready_times_out_with_its_log(tmp_path: Path) -> None:
    spec = ProcessSpec(
        "slow", (sys.executable, "-c", "import time; print('still loading', flush=True); time.sleep(120)"),
        {"UNUSED": "1"}, f"http://127.0.0.1:{free_port()}/health",
    )  # fmt: skip
    process = start(spec, tmp_path)
    try:
        with pytest.raises(LaunchError, match=r"slow not ready after 2s(.|\n)*still loading"):
            await wait_ready([process], timeout_s=2, poll_s=0.2)
    finally:
        process.stop(timeout_s=5)
    assert process.process.poll() is not None


def test_stop_ends_everything_the_server_started(tmp_path: Path) -> None:
    """Like Cleave's gateway: children in sessions of their own, and a leader slow to stop."""
    pids = tmp_path / "pids"
    script = textwrap.dedent(f"""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
        other_session = subprocess.Popen(sleeper, start_new_session=True)
        same_group = subprocess.Popen(sleeper)
        open({str(pids)!r}, "w").write(f"{{other_session.pid}} {{same_group.pid}}")
        time.sleep(300)
    """)
    process = start(ProcessSpec("stubborn", (sys.executable, "-c", script)), tmp_path)
    deadline = time.monotonic() + 30
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        assert time.monotonic() < deadline, "the fake server did not start its children"
        time.sleep(0.05)
    children = [psutil.Process(int(pid)) for pid in pids.read_text().split()]
    assert os.getpgid(children[0].pid) != process.pid and os.getpgid(children[1].pid) == process.pid
    started = time.monotonic()
    process.stop(timeout_s=1)
    assert time.monotonic() - started < 15
    assert process.process.returncode == -signal.SIGKILL
    assert not any(child.is_running() and child.status() != psutil.STATUS_ZOMBIE for child in children)


def test_the_warmup_is_a_run_of_its_own() -> None:
    config = BenchConfig(url="http://x", model="m", rate=2.0, concurrency=None, warmup_requests=3, seed=5)
    warmup = warmup_config(config)
    assert (warmup.seed, warmup.num_requests, warmup.warmup_requests) == (5 + WARMUP_SEED_OFFSET, 3, 0)
    assert (warmup.rate, warmup.concurrency) == (None, 1)


def fake_planner(script: Path, ttft: dict[str, float]) -> Planner:
    def plan(name: str, settings: ServingSettings, ports: PortSource) -> SystemPlan:
        port = ports()
        url = f"http://127.0.0.1:{port}"
        if name == "vllm-pd":  # a system that cannot start
            argv = (sys.executable, "-c", "print('vllm: no NIXL here'); raise SystemExit(1)")
            spec = ProcessSpec("vllm-pd-decode", argv, {}, f"{url}/health")
        else:
            spec = fake_spec(name, script, port, ttft[name])
        return SystemPlan(
            name, url, (spec,), metrics_urls={"gateway": f"{url}/metrics"},
            probes=(HistogramProbe("prefill_stage_ms", "gateway", "cleave_gateway_stage_seconds", {"stage": "prefill"}),),
            description=f"fake {name}",
        )  # fmt: skip

    return plan


@pytest.fixture
def fake_guidellm(tmp_path: Path) -> GuidellmOptions:
    venv, lock = tmp_path / "guidellm-venv", tmp_path / "lock.txt"
    lock.write_text("guidellm==0.8.1\n")
    (venv / "bin").mkdir(parents=True)
    binary = venv / "bin" / "guidellm"
    binary.write_text(FAKE_GUIDELLM.format(python=sys.executable, fixture=str(FIXTURE)))
    binary.chmod(0o755)
    guidellm.write_stamp(venv, lock)  # as if installed from this lock: reused, not reinstalled
    return GuidellmOptions(venv, lock, (), timeout_s=60)


async def test_the_comparison_runs_every_system_and_writes_reports(
    server_script: Path, tmp_path: Path, fake_guidellm: GuidellmOptions
) -> None:
    sizes = CompareSizes(
        output_len=4, short_input_len=5, short_requests=6, short_concurrency=2,
        prefix_requests=4, prefix_concurrency=2, num_prefixes=2, prefix_len=8, warmup_requests=2,
    )  # fmt: skip
    out = tmp_path / "out"
    options = CompareOptions(
        systems=("vllm", "cleave-1p1d", "vllm-pd"),
        workloads=("short-chat", "prefix"),
        out_dir=out,
        model="fake",
        settings=ServingSettings(model_path=tmp_path, served_name="fake-model", startup_timeout_s=60),
        sizes=sizes,
        stop_timeout_s=20,
        guidellm=fake_guidellm,
        progress=False,
    )
    planner = fake_planner(server_script, {"vllm": 0.03, "cleave-1p1d": 0.01})
    results = await run_comparison(options, planner, free_port)

    assert list(results) == ["short-chat", "prefix"]
    for workload, outcomes in results.items():
        assert [o.system for o in outcomes] == ["vllm", "cleave-1p1d", "vllm-pd"]
        for outcome in outcomes[:2]:
            assert outcome.summary is not None and outcome.summary.completed == sizes.num_requests(workload)
            # The stage histogram saw the measured requests only (warmup excluded), each
            # observing the fake's prefill time.
            stage = outcome.stages["prefill_stage_ms"]
            assert stage.count == sizes.num_requests(workload)
            expected_ms = {"vllm": 30.0, "cleave-1p1d": 10.0}[outcome.system]
            assert stage.mean_ms == pytest.approx(expected_ms)
            assert outcome.guidellm is not None and outcome.guidellm.result is not None
            assert outcome.guidellm.result.ttft_p50_ms == 120.0
        failed = outcomes[2]
        assert failed.summary is None and failed.error is not None
        assert "exited with code 1" in failed.error and "vllm: no NIXL here" in failed.error

        document = json.loads((out / f"{workload}.json").read_text())
        assert set(document["systems"]) == {"vllm", "cleave-1p1d", "vllm-pd"}
        values = {name: document["systems"][name]["metrics"] for name in ("vllm", "cleave-1p1d")}
        ratio = next(
            r for r in document["ratios"]
            if (r["system"], r["peer"], r["metric"]) == ("cleave-1p1d", "vllm", "ttft_p50_ms")
        )  # fmt: skip
        assert ratio["value"] == pytest.approx(
            values["cleave-1p1d"]["ttft_p50_ms"] / values["vllm"]["ttft_p50_ms"]
        )
        assert document["meta"]["startup_s"].keys() == {"vllm", "cleave-1p1d"}
        page = (out / f"{workload}.md").read_text()
        assert "| cleave-1p1d ÷ vllm |" in page and "## GuideLLM cross-check" in page
        raw = json.loads((out / "raw" / f"cleave-1p1d-{workload}.json").read_text())
        assert len(raw["runs"][0]["records"]) == sizes.num_requests(workload)
        scenario = json.loads((out / "guidellm" / f"vllm-{workload}.scenario.json").read_text())
        assert scenario["spec"]["backend"]["target"] == document["meta"]["endpoints"]["vllm"]
    # Every fake system was stopped (the launcher's reaper lives as long as this process).
    for name in ("vllm", "cleave-1p1d"):
        assert "fake guidellm" in (out / "logs" / name / "guidellm-short-chat.log").read_text()
    assert not [
        p
        for p in psutil.Process().children(recursive=True)
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE and p.pid != reaper_pid()
    ]

"""tools/bench/proc_cpu.py on a fake /proc: the process tree, roles and CPU per role."""

from __future__ import annotations

from pathlib import Path

from tools.bench import proc_cpu

TICKS = proc_cpu._TICKS_PER_S


def _process(proc: Path, pid: int, ppid: int, cmdline: str, ticks: int) -> None:
    folder = proc / str(pid)
    folder.mkdir(exist_ok=True)
    # comm with a space and a parenthesis, as setproctitle'd names may have.
    fields = ["S", str(ppid)] + ["0"] * 9 + [str(ticks), str(ticks)] + ["0"] * 10
    (folder / "stat").write_text(f"{pid} (odd (name) {' '.join(fields)}\n")
    (folder / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")


def _cleave(proc: Path, ticks: int) -> None:
    _process(proc, 10, 1, "python -m services.gateway.main --mode pd", ticks)
    _process(proc, 11, 10, "python -m services.tokenizer.main --model m", ticks)
    _process(proc, 12, 10, "python -m services.worker.main --role both", ticks)
    _process(proc, 13, 12, "VLLM::EngineCore", ticks)
    _process(proc, 14, 13, "VLLM::Worker", ticks)
    _process(proc, 99, 1, "python -m services.gateway.main --mode pd", ticks)  # someone else's


def test_roles_and_cpu_of_a_cleave_stack(tmp_path: Path) -> None:
    _cleave(tmp_path, TICKS)  # 2 s each (utime + stime)
    before = proc_cpu.snapshot([10], tmp_path)
    assert {pid: role for pid, (role, _) in before.items()} == {
        10: proc_cpu.GATEWAY,
        11: proc_cpu.TOKENIZER,
        12: proc_cpu.WORKER,
        13: proc_cpu.ENGINE,
        14: proc_cpu.ENGINE,
    }
    _cleave(tmp_path, 2 * TICKS)
    spent = proc_cpu.cpu_by_role(before, proc_cpu.snapshot([10], tmp_path))
    assert spent == {"gateway": 2.0, "tokenizer": 2.0, "worker": 2.0, "engine": 4.0}
    assert proc_cpu.serving_layer(spent) == 6.0


def test_vllm_api_server_and_its_engine(tmp_path: Path) -> None:
    _process(tmp_path, 20, 1, "python -m vllm.entrypoints.openai.api_server --model m", TICKS)
    _process(tmp_path, 21, 20, "VLLM::EngineCore", TICKS)
    roles = {role for role, _ in proc_cpu.snapshot([20], tmp_path).values()}
    assert roles == {proc_cpu.API_SERVER, proc_cpu.ENGINE}
    assert proc_cpu.snapshot([404], tmp_path) == {}

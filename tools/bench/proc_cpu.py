"""CPU time per process of a serving system, from /proc (Linux), grouped by what each process is.

A system is a tree of processes under the one the benchmark started (Cleave's gateway starts
its tokenizer and workers, each worker its vLLM EngineCore, which starts the model runner; vLLM's
API server starts its EngineCore). `snapshot` reads utime + stime of every live process of the
tree (all threads included); the difference of two snapshots around a run, divided by the
tokens the run generated, is each process's CPU per generated token: the number issue 17 asks
for, steadier on a shared machine than any latency.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")

# Roles. `engine` is vLLM's own work (EngineCore, model runner) in every system; everything
# else is the serving layer around it, which is what the comparison weighs.
GATEWAY = "gateway"
TOKENIZER = "tokenizer"
WORKER = "worker"  # Cleave's worker process: gRPC, the request logic and vLLM's engine-core client
KVSTORE = "kvstore"
API_SERVER = "api-server"  # vLLM's OpenAI server process (HTTP, AsyncLLM client, detokenizer)
PROXY = "proxy"
ENGINE = "engine"
OTHER = "other"


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int
    cmdline: str
    cpu_s: float


def read_process(pid: int, proc: Path = PROC) -> ProcessInfo | None:
    """None when the process is gone (or unreadable)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    # Field 2 (comm) may hold spaces and parentheses: split after its closing one.
    fields = stat[stat.rindex(")") + 2 :].split()
    ppid = int(fields[1])
    utime, stime = int(fields[11]), int(fields[12])
    cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return ProcessInfo(pid, ppid, cmdline, (utime + stime) / _TICKS_PER_S)


def process_tree(root: int, proc: Path = PROC) -> dict[int, ProcessInfo]:
    """The live processes at and below `root`, by pid."""
    infos: dict[int, ProcessInfo] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            info = read_process(int(entry.name), proc)
            if info is not None:
                infos[info.pid] = info
    tree: dict[int, ProcessInfo] = {}
    frontier = [root] if root in infos else []
    while frontier:
        pid = frontier.pop()
        tree[pid] = infos[pid]
        frontier.extend(p.pid for p in infos.values() if p.ppid == pid and p.pid not in tree)
    return tree


def role(info: ProcessInfo, tree: Mapping[int, ProcessInfo]) -> str:
    """What a process of a serving system is, from its command line and its ancestors'."""
    own = _own_role(info.cmdline)
    if own is not None:
        return own
    parent = tree.get(info.ppid)
    while parent is not None:
        # Below a Cleave worker or vLLM's server, every process is the engine's (EngineCore,
        # the model runner, multiprocessing's helpers).
        if _own_role(parent.cmdline) in (WORKER, API_SERVER):
            return ENGINE
        parent = tree.get(parent.ppid)
    return OTHER


def _own_role(cmdline: str) -> str | None:
    if "services.gateway" in cmdline or "services/gateway" in cmdline:
        return GATEWAY
    if "services.tokenizer" in cmdline or "services/tokenizer" in cmdline:
        return TOKENIZER
    if "services.worker" in cmdline or "services/worker" in cmdline:
        return WORKER
    if "services.kvstore" in cmdline or "services/kvstore" in cmdline:
        return KVSTORE
    if "vllm.entrypoints" in cmdline or "vllm serve" in cmdline or "::APIServer" in cmdline:
        return API_SERVER
    if "vllm_disagg_proxy" in cmdline or "reference_server" in cmdline:
        return PROXY
    return None


def snapshot(roots: Iterable[int], proc: Path = PROC) -> dict[int, tuple[str, float]]:
    """pid -> (role, CPU seconds so far) of every process below the roots."""
    result: dict[int, tuple[str, float]] = {}
    for root in roots:
        tree = process_tree(root, proc)
        for pid, info in tree.items():
            result[pid] = (role(info, tree), info.cpu_s)
    return result


def cpu_by_role(
    before: Mapping[int, tuple[str, float]], after: Mapping[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds each role spent between two snapshots. A process that started in between
    counts from 0; one that ended in between is lost (serving systems keep theirs)."""
    spent: dict[str, float] = {}
    for pid, (name, cpu_s) in after.items():
        start = before.get(pid, (name, 0.0))[1]
        spent[name] = spent.get(name, 0.0) + max(cpu_s - start, 0.0)
    return spent


def serving_layer(spent: Mapping[str, float]) -> float:
    """CPU of everything but the engine: Cleave's gateway, tokenizer, worker processes (and
    kvstore), or vLLM's API server (and P/D proxy)."""
    return sum(seconds for name, seconds in spent.items() if name != ENGINE)

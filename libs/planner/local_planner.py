"""The planner of a local stack (the gateway's `--planner`): it runs in the gateway process,
which started the stack's workers and is its only gateway, reads that gateway's own metrics,
and starts and drains workers through the local connector (connectors/local.py)."""

from __future__ import annotations

import asyncio

import structlog

from libs.config.groups import EngineKind, GrpcSecurityFlags
from libs.config.roles import Role
from libs.gateway.fleet.pool import WorkerPool
from libs.mockengine.profiles import load_profile
from libs.planner.capacity import Engine
from libs.planner.config import DEFAULT_PROFILE, PlannerFlags
from libs.planner.connectors.local import LocalConnector
from libs.planner.loop import Planner
from libs.planner.policy import Policy
from libs.planner.scrape import scrape_local
from libs.stack import local
from libs.stack.config import StackConfig, usable_cores
from libs.stack.launcher import LocalStack
from libs.worker.config import WorkerConfig

log = structlog.get_logger(__name__)


def managed_roles(stack: StackConfig) -> tuple[Role, ...]:
    return (Role.BOTH,) if stack.mode.colocated else (Role.PREFILL, Role.DECODE)


def planner_for_stack(
    flags: PlannerFlags,
    stack_config: StackConfig,
    stack: LocalStack,
    pool: WorkerPool,
    *,
    worker_module: str,
    kvstore_address: str | None,
    security: GrpcSecurityFlags,
) -> Planner:
    mock = stack_config.engine is EngineKind.MOCK
    profile = flags.profile or (stack_config.mock_profile if mock else DEFAULT_PROFILE)
    # A CPU profile's coefficients depend on the cores an engine computes on.
    cores = flags.cores_per_worker or len(stack_config.decode.device_group) or len(usable_cores())
    engine = Engine.from_profile(profile, cores)
    startup = flags.startup_s
    if startup is None and mock and stack_config.mock_startup_s is not None:
        startup = stack_config.mock_startup_s
    if startup is None:
        startup = load_profile(profile).startup_s
    time_scale = flags.time_scale or (stack_config.mock_time_scale if mock else 1.0)
    roles = managed_roles(stack_config)
    policy = Policy(flags.policy(roles, startup), engine)

    def new_config(role: Role, index: int) -> WorkerConfig:
        options = stack_config.prefill if role is Role.PREFILL else stack_config.decode
        return local.worker_config(stack_config, role, options, index, kvstore_address, security)

    connector = LocalConnector(stack, pool, new_config, worker_module)
    log.info(
        "planner: sizing the local stack",
        roles=[r.value for r in roles],
        profile=profile,
        time_scale=time_scale,
        startup_s=startup,
        objectives=flags.slo().describe(),
    )
    return Planner(policy, connector, scrape_local, time_scale=time_scale, dry_run=flags.dry_run)


def start(planner: Planner) -> asyncio.Task[None]:
    return asyncio.create_task(planner.run(), name="planner")

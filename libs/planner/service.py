"""The planner service (services/planner): one per fleet, however many gateways. It reads every
gateway's /metrics, decides, and scales the role Deployments through the Kubernetes API.

Why a service of its own rather than an elected gateway: scaling Deployments needs API
credentials (RBAC to patch `deployments/scale` and pods), which the internet-facing gateways
should not hold; one Deployment with one replica (strategy Recreate) is the singleton, with
no election protocol to run; and the planner holds no state that a restart loses (it
rebuilds its windows from the next scrapes and reads the counts back from the API), so the
fleet merely keeps its size while it is away. Two planners briefly overlapping would ask for
the same absolute replica counts from the same metrics.
"""

from __future__ import annotations

import asyncio
import signal

import structlog

from libs.mockengine.profiles import load_profile
from libs.planner.config import PlannerServiceConfig
from libs.planner.connectors.kubernetes import KubeApi, KubernetesConnector
from libs.planner.loop import Planner
from libs.planner.policy import Policy
from libs.planner.scrape import HttpScraper

log = structlog.get_logger(__name__)


def build(config: PlannerServiceConfig) -> tuple[Planner, HttpScraper]:
    profile = config.profile or config.mock_profile
    startup = config.startup_s if config.startup_s is not None else load_profile(profile).startup_s
    policy = Policy(config.policy(config.roles, startup), config.engine(profile))
    api = KubeApi(config.kube_api_url, token_file=config.kube_token_file, ca_file=config.kube_ca_file)
    connector = KubernetesConnector(api, config.resolved_namespace(), config.deployments(), config.roles)
    scraper = HttpScraper(config.gateways, api_key_file=config.gateway_api_key_file)
    planner = Planner(policy, connector, scraper, time_scale=config.time_scale or 1.0, dry_run=config.dry_run)
    log.info(
        "planner started",
        roles=[r.value for r in config.roles],
        profile=profile,
        startup_s=startup,
        objectives=config.slo().describe(),
        gateways=list(config.gateways),
    )
    return planner, scraper


async def run_until_signal(planner: Planner, scraper: HttpScraper) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    task = asyncio.create_task(planner.run())
    try:
        await stop.wait()
    finally:
        task.cancel()
        await planner.connector.close()
        await scraper.close()
        log.info("planner stopped")

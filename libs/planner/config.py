"""The planner's flags (the only place they are declared): `PlannerFlags`, the control law's
settings, which the gateway takes as `--planner-*` (a local stack's planner) and the planner
service unprefixed; `PlannerServiceConfig`, the service's (services/planner: Kubernetes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from libs.config.codecs import NON_NEGATIVE_INT, PORT, POSITIVE_INT, choice
from libs.config.errors import ConfigError
from libs.config.flags import FLOAT, PATH, Codec, flag, group, parse
from libs.config.groups import LoggingFlags
from libs.config.roles import Role
from libs.planner.capacity import Engine
from libs.planner.policy import PolicyConfig
from libs.planner.slo import ITL_STATS, Slo
from libs.planner.state import Counts

DEFAULT_PROFILE = "cpu-smollm2"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def _roles(flag_name: str, text: str) -> tuple[Role, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if names in (("prefill", "decode"), ("decode", "prefill")):
        return (Role.PREFILL, Role.DECODE)
    if names in (("both",), ("pd",)):
        return (Role.BOTH,)
    raise ConfigError(flag_name, text, "'prefill,decode' (a disaggregated fleet) or 'pd' (colocated workers)")


ROLES: Codec[tuple[Role, ...]] = Codec(
    _roles, lambda roles: "pd" if roles == (Role.BOTH,) else ",".join(r.value for r in roles)
)


@dataclass(frozen=True, kw_only=True)
class PlannerFlags:
    """The control law (libs/planner/policy.py) and its objectives."""

    ttft_ms: float = flag(500.0, codec=FLOAT, help="TTFT objective, ms")
    itl_ms: float = flag(50.0, codec=FLOAT, help="ITL objective, ms")
    itl_stat: str = flag(
        "mean",
        codec=choice(ITL_STATS),
        help="a request's ITL: mean (its TPOT, DistServe's) or p99 (its own 99th-percentile gap)",
    )
    attainment: float = flag(0.9, codec=FLOAT, help="fraction of requests that must meet both objectives")
    profile: str | None = flag(
        None,
        help="mock profile (libs/mockengine/profiles) whose step-time formula predicts each worker's "
        f"capacity (default: the stack's --mock-profile on mock workers, else {DEFAULT_PROFILE})",
    )
    cores_per_worker: int | None = flag(
        None, codec=POSITIVE_INT, help="cores each engine computes on (picks a CPU profile's coefficients)"
    )
    startup_s: float | None = flag(
        None, codec=FLOAT, help="seconds a new worker takes to serve (default: the profile's start-up time)"
    )
    time_scale: float | None = flag(
        None,
        codec=FLOAT,
        help="mock workers' --mock-time-scale: observed times are divided by it, rates multiplied "
        "(default: the stack's on mock workers, else 1)",
    )
    interval_s: float = flag(10.0, codec=FLOAT, help="seconds between decisions (simulated seconds on mocks)")
    min_per_role: int = flag(1, codec=NON_NEGATIVE_INT, help="fewest workers of each role it manages")
    max_per_role: int = flag(8, codec=POSITIVE_INT, help="most workers of each role it manages")
    utilization: float = flag(0.85, codec=FLOAT, help="fraction of predicted capacity planned when adding")
    down_utilization: float = flag(
        0.6, codec=FLOAT, help="fraction of predicted capacity planned when removing (hysteresis band)"
    )
    down_delay_s: float = flag(60.0, codec=FLOAT, help="seconds fewer workers must suffice before one goes")
    drain_s: float = flag(
        30.0, codec=FLOAT, help="seconds a backlog of waiting requests should take to clear"
    )
    dry_run: bool = flag(False, help="log and export decisions without changing the fleet")

    def slo(self) -> Slo:
        return Slo(self.ttft_ms / 1000.0, self.itl_ms / 1000.0, self.itl_stat, self.attainment)

    def engine(self, profile: str) -> Engine:
        return Engine.from_profile(self.profile or profile, self.cores_per_worker)

    def policy(self, roles: Sequence[Role], profile_startup_s: float) -> PolicyConfig:
        lowest = Counts.of({role: self.min_per_role for role in roles})
        highest = Counts.of({role: self.max_per_role for role in roles})
        return PolicyConfig(
            slo=self.slo(),
            minimum=lowest,
            maximum=highest,
            startup_s=profile_startup_s if self.startup_s is None else self.startup_s,
            interval_s=self.interval_s,
            utilization=self.utilization,
            down_utilization=self.down_utilization,
            down_delay_s=self.down_delay_s,
            drain_s=self.drain_s,
        )

    def __post_init__(self) -> None:
        if not (self.ttft_ms > 0 and self.itl_ms > 0 and 0 < self.attainment <= 1):
            raise ConfigError("--ttft-ms/--itl-ms/--attainment", None, "objectives > 0, attainment in (0, 1]")
        if self.min_per_role > self.max_per_role:
            raise ConfigError(
                "--min-per-role", self.min_per_role, f"at most --max-per-role ({self.max_per_role})"
            )
        if not 0 < self.down_utilization <= self.utilization <= 1:
            raise ConfigError("--down-utilization", self.down_utilization, "in (0, --utilization]")
        if self.time_scale is not None and not self.time_scale > 0:
            raise ConfigError("--time-scale", self.time_scale, "a number > 0")


@dataclass(frozen=True, kw_only=True)
class KubeFlags:
    """Where the Kubernetes API is and which Deployments are the fleet's roles."""

    kube_api_url: str = flag("https://kubernetes.default.svc", help="the Kubernetes API server")
    kube_token_file: Path | None = flag(
        SERVICE_ACCOUNT / "token", codec=PATH, help="bearer token (the pod's service account)"
    )
    kube_ca_file: Path | None = flag(
        SERVICE_ACCOUNT / "ca.crt", codec=PATH, help="CA of the API server's certificate (unset: system CAs)"
    )
    namespace: str | None = flag(None, help="the fleet's namespace (default: the service account's)")
    prefill_deployment: str = flag("prefill", help="Deployment of the prefill workers")
    decode_deployment: str = flag("decode", help="Deployment of the decode workers")
    pd_deployment: str = flag("pd", help="Deployment of the colocated workers")

    def deployments(self) -> dict[Role, str]:
        return {
            Role.PREFILL: self.prefill_deployment,
            Role.DECODE: self.decode_deployment,
            Role.BOTH: self.pd_deployment,
        }

    def resolved_namespace(self) -> str:
        if self.namespace:
            return self.namespace
        path = SERVICE_ACCOUNT / "namespace"
        try:
            return path.read_text().strip()
        except OSError:
            raise ConfigError(
                "--namespace", None, f"a namespace (none given and {path} unreadable)"
            ) from None


@dataclass(frozen=True, kw_only=True)
class PlannerServiceConfig(LoggingFlags, KubeFlags, PlannerFlags):
    """Cleave planner: sizes a fleet's prefill and decode Deployments for TTFT and ITL objectives."""

    host: str = flag("0.0.0.0", help="address of the /metrics HTTP server")
    port: int = flag(9500, codec=PORT, help="port of the /metrics HTTP server")
    gateways: tuple[str, ...] = flag(
        (),
        codec=Codec(lambda _flag, text: tuple(p.strip() for p in text.split(",") if p.strip()), ",".join),
        help="gateways' metrics URLs (http://HOST:PORT/metrics); a host name stands for every "
        "address it resolves to (a headless Service of the gateway pods)",
    )
    gateway_api_key_file: Path | None = flag(
        None, codec=PATH, help="API key for gateways started with --auth-health"
    )
    roles: tuple[Role, ...] = flag(
        (Role.PREFILL, Role.DECODE), codec=ROLES, help="the roles it sizes: prefill,decode or pd"
    )
    mock_profile: str = flag(DEFAULT_PROFILE, help="the profile --profile defaults to (the workers' engine)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.gateways:
            raise ConfigError("--gateways", None, "the gateways' metrics URLs")


def parse_args(argv: Sequence[str] | None = None) -> PlannerServiceConfig:
    return parse(PlannerServiceConfig, argv)


def planner_group() -> PlannerFlags:
    return PlannerFlags()


PLANNER_GROUP = group("planner", factory=planner_group)

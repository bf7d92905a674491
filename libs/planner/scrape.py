"""Where the planner reads the gateways' metrics: its own process's registry (the local stack's
planner runs inside the gateway) or every gateway's /metrics over HTTP (the planner service),
a host name standing for every address it resolves to, as worker names do for the gateway."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import structlog
from prometheus_client import REGISTRY, generate_latest

from libs.gateway.fleet.discovery import is_literal, join_address, one_family, resolve_host
from libs.planner.observe import Scrape

log = structlog.get_logger(__name__)


async def scrape_local() -> list[Scrape]:
    return [Scrape.parse("local", generate_latest(REGISTRY).decode())]


class HttpScraper:
    def __init__(
        self, urls: tuple[str, ...], *, api_key_file: Path | None = None, timeout_s: float = 5.0
    ) -> None:
        self._urls = urls
        self._api_key_file = api_key_file
        self._client = httpx.AsyncClient(timeout=timeout_s)

    async def targets(self) -> list[str]:
        """Every URL with its host replaced by each address it resolves to."""
        found: list[str] = []
        for url in self._urls:
            parts = urlsplit(url)
            host = parts.hostname or ""
            if is_literal(host) or host == "localhost":
                found.append(url)
                continue
            try:
                addresses = one_family(await resolve_host(host))
            except OSError as error:
                log.warning("planner: gateway name lookup failed", host=host, error=str(error))
                continue
            port = str(parts.port) if parts.port else ""
            for address in addresses:
                netloc = join_address(address, port) if port else address
                found.append(urlunsplit(parts._replace(netloc=netloc)))
        return found

    async def __call__(self) -> list[Scrape]:
        headers = {}
        if self._api_key_file is not None:
            headers["Authorization"] = "Bearer " + self._api_key_file.read_text().strip()
        targets = await self.targets()
        responses = await asyncio.gather(
            *(self._client.get(url, headers=headers) for url in targets), return_exceptions=True
        )
        scrapes = []
        for url, response in zip(targets, responses, strict=True):
            if isinstance(response, BaseException) or response.status_code != 200:
                log.warning("planner: gateway metrics unreadable", url=url, error=repr(response))
                continue
            scrapes.append(Scrape.parse(url, response.text))
        return scrapes

    async def close(self) -> None:
        await self._client.aclose()

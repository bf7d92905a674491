"""The metrics check on a live compose stack (compose_live_checks.py): the decode worker's
scrape shows vLLM's metric names, with vLLM's labels, at the values the engine's state implies
while 4 streams run and after they end; the requests' counts show on decode's, prefill's and the
gateway's (engine="gateway") vLLM counters."""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

from tests.deploy.live_stack import CheckFailed, Stack, log, samples, total
from tests.deploy.live_streams import start_streams

STREAMS = 4
MAX_TOKENS = 48


def check_metrics(stack: Stack, args: argparse.Namespace) -> None:
    model = stack.get_json("/v1/models")["data"][0]["id"]
    decode = stack.containers("decode")[0]
    prefill = stack.containers("prefill")[0]
    before = {"decode": stack.worker_metrics(decode), "prefill": stack.worker_metrics(prefill)}
    gateway_before = stack.gateway_metrics()
    labels = {
        dict(labels).get("model_name") for labels, _ in samples(before["decode"], "vllm:num_requests_running")
    }
    if labels != {model}:
        raise CheckFailed(
            f"metrics: decode's vllm:num_requests_running has model_name {labels}, not {model!r}"
        )
    with ThreadPoolExecutor(STREAMS) as pool:
        streams = start_streams(pool, stack.base, model, STREAMS, max_tokens=MAX_TOKENS, structured_every=0)
        deadline = time.monotonic() + args.request_timeout
        while min(s.tokens for s, _ in streams) < 4:
            if time.monotonic() > deadline or any(f.done() for _, f in streams):
                raise CheckFailed(f"metrics: streams did not all start: {[s.tokens for s, _ in streams]}")
            time.sleep(0.05)
        during = stack.worker_metrics(decode)
        finished_early = sum(f.done() for _, f in streams)
        for _, future in streams:
            future.result(timeout=args.request_timeout)
    running, waiting = total(during, "vllm:num_requests_running"), total(during, "vllm:num_requests_waiting")
    usage = total(during, "vllm:kv_cache_usage_perc")
    # Every stream had tokens and none had ended: the engine ran all four (or queued some).
    if finished_early == 0 and (running + waiting != STREAMS or running < 1 or usage <= 0):
        raise CheckFailed(f"metrics: with {STREAMS} streams running decode reports running {running}, "
                          f"waiting {waiting}, KV cache usage {usage}")  # fmt: skip
    time.sleep(2)  # vLLM's stat logger records after the last step
    after = {"decode": stack.worker_metrics(decode), "prefill": stack.worker_metrics(prefill)}
    idle = [total(after["decode"], n) for n in ("vllm:num_requests_running", "vllm:num_requests_waiting")]
    idle_usage = total(after["decode"], "vllm:kv_cache_usage_perc")
    if idle != [0, 0] or idle_usage > 0.01:
        raise CheckFailed(
            f"metrics: after the streams decode reports running/waiting {idle}, usage {idle_usage}"
        )
    completion = sum(s.tokens for s, _ in streams)
    delta = {
        role: {
            name: total(after[role], name, **extra) - total(before[role], name, **extra)
            for name, extra in (
                ("vllm:request_success_total", {"finished_reason": "length"}),
                ("vllm:generation_tokens_total", {}),
            )
        }
        for role in after
    }
    gateway_after = stack.gateway_metrics()
    gateway_done = total(
        gateway_after, "vllm:request_success_total", engine="gateway", finished_reason="length"
    ) - total(gateway_before, "vllm:request_success_total", engine="gateway", finished_reason="length")
    if (
        delta["decode"]["vllm:request_success_total"] != STREAMS
        or delta["prefill"]["vllm:request_success_total"] != STREAMS
    ):
        raise CheckFailed(f"metrics: vLLM's request counters moved by {delta}, not {STREAMS} each")
    if gateway_done != STREAMS:
        raise CheckFailed(f"metrics: the gateway's vllm:request_success_total moved by {gateway_done}")
    generated = delta["decode"]["vllm:generation_tokens_total"]
    if generated not in (STREAMS * MAX_TOKENS, STREAMS * (MAX_TOKENS - 1)):
        raise CheckFailed(
            f"metrics: decode generated {generated} tokens by vLLM's counter for {STREAMS} x {MAX_TOKENS}"
        )
    log(
        f"metrics: decode's scrape during {STREAMS} streams: vllm:num_requests_running {running:.0f}, "
        f"vllm:num_requests_waiting {waiting:.0f}, vllm:kv_cache_usage_perc {usage:.4f}; after: "
        f"{idle[0]:.0f}, {idle[1]:.0f}, {idle_usage:.4f}; vllm:request_success_total{{finished_reason=length}} "
        f"+{delta['decode']['vllm:request_success_total']:.0f} decode, "
        f"+{delta['prefill']['vllm:request_success_total']:.0f} prefill, +{gateway_done:.0f} gateway; "
        f"vllm:generation_tokens_total +{generated:.0f} decode, +{delta['prefill']['vllm:generation_tokens_total']:.0f} "
        f"prefill ({completion} content deltas streamed)"
    )

"""A model's KV layout: what KV producers and consumers must agree on (libs/kvlayout/layout.py).

A package of its own so that the dependency runs one way: the worker (handoff checks, the
layout it reports in GetInfo), the kvstore connector (chunk keys) and the kvstore all depend
on it, and it depends on none of them, only on the common contract. Putting it in the worker
would make the kvstore side depend on the worker; putting it in libs/kvconnector would make
the worker's engine-agnostic library depend on a vLLM connector.
"""

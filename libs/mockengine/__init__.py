"""A simulator of vLLM v1's engine for tests, benchmarks and fleet planning (issue 29).

It never serves users. Nothing here imports torch or vLLM: fleet-size stacks run many mock
workers on a small machine. The pieces:
- engine.py: MockEngine, the worker's Engine protocol, over client.py (the core's client);
- core.py / core_main.py: the engine-core process and its loop;
- simulator.py: one engine step (scheduler.py, kv_manager.py, blocks.py, hashing.py,
  tokens.py, leases.py), timing.py and profiles/ for how long steps take;
- protocol.py / kv_events.py: the messages; side_channel.py: KV pulls between cores;
  faults.py: injected crashes, stalls and refused pulls.
"""

"""The SLA planner (issue 32): sizes a fleet's prefill and decode workers for TTFT and ITL
targets, before anything runs (the planning mode) and while it serves (the control loop).

- workload.py, slo.py: what is asked of a fleet (arrival rate, prompt and output lengths,
  the objectives);
- capacity.py: what one worker of each role sustains under the objectives, from a mock
  profile's step-time formula;
- sim/: a discrete-event simulation of a fleet behind the gateway, driven by the mock
  engine's own scheduler and the same profile;
- recommend.py: the planning mode (XpYd or pd, and the conditional-disaggregation threshold);
- policy.py: the control law (targets from observed load, hysteresis, min/max, start-up time);
- observe.py: the fleet's state read from the gateways' /metrics;
- connectors/: how counts change (the local stack, Kubernetes);
- loop.py, config.py: the planner process (services/planner) and its flags.
"""

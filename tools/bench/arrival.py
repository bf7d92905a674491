"""Open-loop arrival times, as vLLM's benchmark_serving defines them.

Inter-arrival gaps are gamma-distributed with shape `burstiness` and mean 1/rate: burstiness 1
is a Poisson process, < 1 burstier (same mean rate, larger variance: 1 / (rate² · burstiness)),
> 1 more regular.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np


def inter_arrival_gaps(rate: float, burstiness: float, seed: int) -> Iterator[float]:
    """Seconds between successive request arrivals, forever; rate = inf sends all at once."""
    if math.isinf(rate):
        while True:
            yield 0.0
    rng = np.random.default_rng(seed)
    scale = 1.0 / (rate * burstiness)
    while True:
        # Drawn in blocks: one numpy call per gap would dominate at high rates.
        yield from (float(gap) for gap in rng.gamma(shape=burstiness, scale=scale, size=1024))

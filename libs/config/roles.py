"""What a Cleave engine worker does with a request: the one role type every layer shares (the
worker's --role flag, the local stack's worker groups, the gateway's pools and its /health).

A str enum: a role is its flag value wherever text is the interface (flags render its value,
/health and metric labels show it, a pool keyed by the words a user typed takes it), while
every signature names Role, so passing an arbitrary string is still a type error.
"""

from __future__ import annotations

import enum


class Role(enum.StrEnum):
    PREFILL = "prefill"  # computes prompts' KV and hands it over
    DECODE = "decode"  # loads handed-over KV and generates
    BOTH = "both"  # colocated: no transfer

"""One real-engine end-to-end target per machine at a time.

Bazel may run such a target beside other tests (tests/e2e/defs.bzl gives it two of the
machine's CPU slots, not the whole machine), and on a machine with more cores it may start two
of them at once. Their stacks would then share the same cores (a stack's workers are pinned to
cores by device number) and slow each other by far more than half. A lock file that every such
target holds for its whole session keeps them one after another on any machine."""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Bazel gives each test its own TMPDIR; the lock must be one path for the whole machine.
LOCK_PATH = Path("/tmp/cleave-e2e-engines.lock")
# defs.bzl sets it on real-engine targets; mock-engine targets run beside them.
ENV_FLAG = "CLEAVE_E2E_ENGINE_LOCK"


@contextmanager
def engine_lock(path: Path = LOCK_PATH) -> Iterator[float]:
    """Holds `path` exclusively until exit; yields how many seconds it waited for it."""
    started = time.monotonic()
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        waited = time.monotonic() - started
        if waited >= 1:
            print(f"engine_lock: waited {waited:.0f} s for another end-to-end target", file=sys.stderr)
        try:
            yield waited
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def wanted() -> bool:
    return os.environ.get(ENV_FLAG) == "1"

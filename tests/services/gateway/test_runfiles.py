"""`bazel run //services/gateway` starts its local stack's services from its own runfiles, so
the binary must carry every service module the stack launches (a missing kvstore module once
made `--kvstore` fail at start-up while the e2e tests, which depend on it directly, passed)."""

from __future__ import annotations

import os
import re
from pathlib import Path

# This test depends on the gateway binary only (BUILD: data, no service deps), so what is in
# its runfiles came with the binary.
RUNFILES = Path(os.environ.get("TEST_SRCDIR", "."), os.environ.get("TEST_WORKSPACE", "cleave"))


def test_every_service_the_local_stack_starts_ships_with_the_gateway_binary() -> None:
    source = (RUNFILES / "services/entry_points.py").read_text()
    launched = set(re.findall(r'"(services\.\w+\.main)"', source))
    assert {"services.tokenizer.main", "services.worker.main", "services.kvstore.main"} <= launched
    missing = [m for m in sorted(launched) if not (RUNFILES / (m.replace(".", "/") + ".py")).is_file()]
    assert missing == [], f"//services/gateway does not ship {missing}; add their :lib to its deps"

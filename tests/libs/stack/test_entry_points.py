"""The entry-point registry the local stack starts services from."""

from __future__ import annotations

import pytest

from libs.stack.entry_points import EntryPoints, ServiceKind
from libs.stack.process import LaunchError


def test_a_kind_is_started_from_its_registered_module() -> None:
    entry_points = EntryPoints({ServiceKind.WORKER: "some.worker.main"})
    assert entry_points.module(ServiceKind.WORKER) == "some.worker.main"


def test_a_kind_nobody_registered_is_a_launch_error_naming_it() -> None:
    with pytest.raises(LaunchError, match="no entry point registered for the kvstore service"):
        EntryPoints({}).module(ServiceKind.KVSTORE)

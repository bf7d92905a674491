"""The one rule for end-to-end tests: real services as child processes with the real model."""

load("//tools/build_defs:py.bzl", "cleave_py_test")

def cleave_e2e_test(name, deps = [], **kwargs):
    """A large pytest target tagged `e2e` (select or skip them with --test_tag_filters), plus any
    `tags` given (e.g. `fuzz`). `-rP` shows what passing tests printed (start-up times,
    memory, measured values). `srcs`: the test files, `name`.py unless given (suites that share
    a session's stacks run in one target).

    Its stacks keep two cores busy, so it claims two of Bazel's CPU slots (`cpu:2`): with
    .bazelrc's 1.5 slots per core, a 2-core machine runs one unit test beside it, on the core
    its stack leaves idle while it waits (Bazel admits a request when used + 0.6 x requested
    fits: 2 + 0.6 <= 3, and not a second one, 2 + 1.2 > 3). Such targets still run one at a
    time on any machine: each holds tests/e2e/engine_lock.py's lock for its whole session."""
    tags = ["e2e", "cpu:2"] + kwargs.pop("tags", [])
    cleave_py_test(
        name = name,
        size = "large",
        timeout = "eternal",
        srcs = kwargs.pop("srcs", [name + ".py"]),
        args = ["-rP"],
        env = {"CLEAVE_E2E_ENGINE_LOCK": "1"},
        tags = tags,
        deps = [":harness"] + deps,
        **kwargs
    )

def cleave_e2e_mock_test(name, deps = [], **kwargs):
    """An end-to-end test whose stacks run on the mock engine (libs/mockengine): real services
    on loopback, no model loaded. Tagged `e2e` and `mock`; it takes no engine lock (a mock stack
    needs a fraction of a core), so it runs beside other tests."""
    tags = ["e2e", "mock"] + kwargs.pop("tags", [])
    cleave_py_test(
        name = name,
        size = "large",
        srcs = [name + ".py"],
        args = ["-rP"],
        tags = tags,
        deps = [":harness"] + deps,
        **kwargs
    )

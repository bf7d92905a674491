"""The one rule for end-to-end tests: real services as child processes with the real model."""

load("//tools/build_defs:py.bzl", "cleave_py_test")

def cleave_e2e_test(name, deps = [], **kwargs):
    """A large pytest target tagged `e2e` (select or skip them with --test_tag_filters) and
    `exclusive` (two vLLM stacks at once would not fit the 2-core CI machine), plus any
    `tags` given (e.g. `fuzz`). `-rP` shows what passing tests printed (start-up times,
    memory, measured values). `srcs`: the test files, `name`.py unless given (suites that share
    a session's stacks run in one target)."""
    tags = ["e2e", "exclusive"] + kwargs.pop("tags", [])
    cleave_py_test(
        name = name,
        size = "large",
        timeout = "eternal",
        srcs = kwargs.pop("srcs", [name + ".py"]),
        args = ["-rP"],
        tags = tags,
        deps = [":harness"] + deps,
        **kwargs
    )

def cleave_e2e_mock_test(name, deps = [], **kwargs):
    """An end-to-end test whose stacks run on the mock engine (libs/mockengine): real services
    on loopback, no model loaded. Tagged `e2e` and `mock`; not exclusive (a mock stack needs a
    fraction of a core), so it runs beside other tests."""
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

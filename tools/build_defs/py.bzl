"""The one place Cleave's BUILD files get their Python rules from.

Today these forward to Bazel 4's native rules (the only ones that work offline here). With a
modern Bazel, load py_* from rules_python here instead and map `requirement(name)` to
rules_python's; no BUILD file elsewhere changes.
"""

def requirement(name):
    """Label of a locked third-party distribution, e.g. requirement("grpcio")."""
    return "@pypi//:" + name.replace("-", "_").replace(".", "_").lower()

def cleave_py_library(name, **kwargs):
    native.py_library(name = name, srcs_version = "PY3", **kwargs)

def cleave_py_binary(name, **kwargs):
    native.py_binary(name = name, python_version = "PY3", srcs_version = "PY3", **kwargs)

def cleave_py_test(name, size = "small", **kwargs):
    """A pytest-run test: `srcs` are test files, run through //tools/pytest:main."""
    srcs = kwargs.pop("srcs")
    deps = kwargs.pop("deps", [])
    args = kwargs.pop("args", [])
    native.py_test(
        name = name,
        size = size,
        srcs = srcs + ["//tools/pytest:main.py"],
        main = "//tools/pytest:main.py",
        python_version = "PY3",
        srcs_version = "PY3",
        args = args + ["$(location %s)" % s for s in srcs],
        deps = deps + ["//tests:conftest", requirement("pytest")],
        **kwargs
    )

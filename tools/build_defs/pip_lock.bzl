"""A repository rule that installs a hashed pip lock file and exposes one py_library per
distribution, without rules_python (which Bazel 4.2.3 offline cannot fetch).

Moving to a modern Bazel: replace this rule with rules_python's `pip.parse` over the same
lock file; the generated target names (@pypi//:<normalized_name>) are chosen to match the
`requirement()` naming so BUILD files change in one place (tools/build_defs/py.bzl).
"""

def _pip_lock_repository_impl(rctx):
    python = rctx.which("python3")
    if not python:
        fail("python3 not found on PATH; Cleave needs CPython 3.11")
    lock = rctx.path(rctx.attr.lock)
    rctx.report_progress("pip install --require-hashes from %s (first build only)" % rctx.attr.lock)
    result = rctx.execute(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--require-hashes",
            "--only-binary=:all:",
            "--no-warn-script-location",
            "--disable-pip-version-check",
            "--target",
            "site",
            "--requirement",
            str(lock),
        ],
        timeout = 3600,
        environment = {"PIP_ROOT_USER_ACTION": "ignore"},
        quiet = True,
    )
    if result.return_code != 0:
        fail("pip install of %s failed:\n%s\n%s" % (rctx.attr.lock, result.stdout, result.stderr))

    rctx.report_progress("generating py_library targets")
    result = rctx.execute(
        [python, rctx.path(rctx.attr._generator), "site", "BUILD.bazel"],
        timeout = 600,
    )
    if result.return_code != 0:
        fail("generating @%s BUILD failed:\n%s\n%s" % (rctx.name, result.stdout, result.stderr))

pip_lock_repository = repository_rule(
    implementation = _pip_lock_repository_impl,
    attrs = {
        "lock": attr.label(mandatory = True, allow_single_file = True),
        "_generator": attr.label(default = "//tools/build_defs:pip_lock_build.py"),
    },
    doc = "Installs a --require-hashes lock with pip and generates one py_library per package.",
)

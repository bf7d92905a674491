"""A repository rule for files that a locked wheel installs outside site-packages.

pip_lock.bzl installs the lock with `pip install --target`, which keeps only what goes into
site-packages: a wheel's data files (`<name>.data/data/...`) are dropped. intel-openmp ships
its library, libiomp5.so, only that way. This rule downloads that one locked wheel (pip,
--require-hashes with the lock's hashes) and unpacks the named data files, so the @pypi
repository itself is unchanged.
"""

def _locked_wheel_files_impl(rctx):
    python = rctx.which("python3")
    if not python:
        fail("python3 not found on PATH")
    result = rctx.execute(
        [
            python,
            rctx.path(rctx.attr._tool),
            str(rctx.path(rctx.attr.lock)),
            rctx.attr.distribution,
            ".",
        ] + rctx.attr.files,
        timeout = 1200,
        environment = {"PIP_ROOT_USER_ACTION": "ignore"},
        quiet = True,
    )
    if result.return_code != 0:
        fail("unpacking %s from %s failed:\n%s\n%s" % (rctx.attr.files, rctx.attr.distribution, result.stdout, result.stderr))
    rctx.file("BUILD.bazel", "exports_files(%r, visibility = [\"//visibility:public\"])\n" % [f.split("/")[-1] for f in rctx.attr.files])

locked_wheel_files = repository_rule(
    implementation = _locked_wheel_files_impl,
    attrs = {
        "lock": attr.label(mandatory = True, allow_single_file = True),
        "distribution": attr.string(mandatory = True),
        "files": attr.string_list(mandatory = True, doc = "paths under the wheel's .data/data/"),
        "_tool": attr.label(default = "//tools/build_defs:wheel_files.py"),
    },
)

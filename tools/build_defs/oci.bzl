"""Container images of Cleave's py_binary services, built by Bazel alone (no rule set, no
registry, no daemon). tools/build_defs/oci_pack.py writes the bytes; see docs/deploy.md.

Every image is three layers:
  1. the base: a Debian minbase root file system with Python (oci_base_repository);
  2. the locked Python packages (@pypi's site directory: torch, vLLM, ...): one layer built
     once from the union of the services' packages, so every image shares its digest;
  3. the service's own code: its runfiles minus the packages (small; the only layer a Cleave
     change rebuilds).
The runfiles tree lives at /opt/cleave/app.runfiles in every image (the Python launcher
finds its runfiles by that `.runfiles` directory), layer 2 filling its pypi/ part.
"""

RUNFILES_ROOT = "/opt/cleave/app.runfiles"
_DEPS_PREFIX = "pypi/"

OciLayerInfo = provider(fields = ["tar", "descriptor", "runfiles_paths", "left_out_paths"])
OciImageInfo = provider(fields = ["repo_tag", "config", "manifest", "layers", "digest"])

def _runfiles_path(ctx, f):
    # Bazel 4: an external file's short_path is "../repo/path"; the main repository's files
    # sit under the workspace name.
    if f.short_path.startswith("../"):
        return f.short_path[3:]
    return ctx.workspace_name + "/" + f.short_path

def _binary_files(ctx, binary):
    """(runfiles path, File) of a binary's runfiles, the launcher included, without Bazel 4's
    legacy `<workspace>/external/...` duplicates of external files."""
    files = binary[DefaultInfo].default_runfiles.files.to_list()
    executable = binary[DefaultInfo].files_to_run.executable
    if executable:
        files.append(executable)
    pairs = {}
    for f in files:
        path = _runfiles_path(ctx, f)
        if not path.startswith(ctx.workspace_name + "/external/"):
            pairs[path] = f
    return pairs

def _write_layer(ctx, name, spec, inputs, mnemonic):
    tar = ctx.actions.declare_file(name + ".tar")
    descriptor = ctx.actions.declare_file(name + ".json")
    spec_file = ctx.actions.declare_file(name + ".spec.json")
    ctx.actions.write(spec_file, json.encode(spec))
    ctx.actions.run(
        executable = "python3",
        arguments = [ctx.file._packer.path, "layer", "--spec", spec_file.path, "--out", tar.path, "--descriptor", descriptor.path],
        inputs = depset([spec_file, ctx.file._packer], transitive = [inputs]),
        outputs = [tar, descriptor],
        mnemonic = mnemonic,
        progress_message = "Packing image layer %s" % tar.short_path,
        # Gigabytes of site-packages: symlinking them into a sandbox costs more than it saves.
        execution_requirements = {"no-sandbox": "1", "no-remote": "1"},
    )
    return tar, descriptor

_TOOL_ATTRS = {
    # Run as `python3 oci_pack.py` (standard library only): a py_binary launcher wants a
    # `python` on the action's PATH, which Debian does not have.
    "_packer": attr.label(default = "//tools/build_defs:oci_pack.py", allow_single_file = True),
}

def _deps_layer_impl(ctx):
    left_out = {}
    for package in ctx.attr.leave_out:
        for path in _binary_files(ctx, package):
            left_out[path] = True
    chosen = {}
    for binary in ctx.attr.binaries + ctx.attr.packages:
        for path, f in _binary_files(ctx, binary).items():
            if path.startswith(_DEPS_PREFIX) and path not in left_out:
                chosen[path] = f
    spec = [{"dest": RUNFILES_ROOT + "/" + p, "src": chosen[p].path} for p in sorted(chosen)]
    tar, descriptor = _write_layer(ctx, ctx.label.name, spec, depset(chosen.values()), "OciDepsLayer")
    return [
        DefaultInfo(files = depset([tar, descriptor])),
        OciLayerInfo(tar = tar, descriptor = descriptor, runfiles_paths = sorted(chosen), left_out_paths = sorted(left_out)),
    ]

oci_py_deps_layer = rule(
    implementation = _deps_layer_impl,
    attrs = dict(
        _TOOL_ATTRS,
        binaries = attr.label_list(mandatory = True),
        packages = attr.label_list(doc = "more @pypi libraries, for what the image's Python needs beyond the host's"),
        leave_out = attr.label_list(doc = "@pypi libraries without dependencies of their own that the binaries' runfiles hold but the image never imports (GPU-only code in a CPU image)"),
    ),
    doc = "One layer holding the third-party packages (runfiles under pypi/) of all `binaries`.",
)

def _image_impl(ctx):
    deps = ctx.attr.deps_layer[OciLayerInfo]
    in_deps = {p: True for p in deps.runfiles_paths}
    left_out = {p: True for p in deps.left_out_paths}
    own = {}
    for path, f in _binary_files(ctx, ctx.attr.binary).items():
        if path.startswith(_DEPS_PREFIX):
            if path not in in_deps and path not in left_out:
                fail("%s needs %s, which %s does not hold: add the binary to its `binaries`" % (
                    ctx.attr.binary.label,
                    path,
                    ctx.attr.deps_layer.label,
                ))
        else:
            own[path] = f
    spec = [{"dest": RUNFILES_ROOT + "/" + p, "src": own[p].path} for p in sorted(own)]
    extra = []
    for target, dest in ctx.attr.files.items():
        for f in target.files.to_list():
            spec.append({"dest": dest, "src": f.path})
            extra.append(f)
    app_tar, app_descriptor = _write_layer(
        ctx,
        ctx.label.name + ".app",
        spec,
        depset(own.values() + extra),
        "OciAppLayer",
    )

    executable = ctx.attr.binary[DefaultInfo].files_to_run.executable
    launcher = RUNFILES_ROOT + "/" + _runfiles_path(ctx, executable)
    config = {
        "User": ctx.attr.user,
        "Env": ["%s=%s" % (k, v) for k, v in sorted(ctx.attr.env.items())],
        "Entrypoint": ["python3", launcher],
        "Cmd": ctx.attr.cmd,
        "WorkingDir": ctx.attr.workdir,
        "Labels": dict(ctx.attr.labels, **{"org.opencontainers.image.title": ctx.attr.repo_tag.split(":")[0]}),
    }
    if ctx.attr.exposed_ports:
        config["ExposedPorts"] = {p: {} for p in ctx.attr.exposed_ports}
    if ctx.attr.healthcheck:
        # Docker's image config field (durations in nanoseconds); podman reads it too.
        config["Healthcheck"] = {
            "Test": ["CMD"] + ctx.attr.healthcheck,
            "Interval": ctx.attr.health_interval_s * 1000000000,
            "Timeout": ctx.attr.health_timeout_s * 1000000000,
            "StartPeriod": ctx.attr.health_start_period_s * 1000000000,
            "Retries": ctx.attr.health_retries,
        }
    settings = ctx.actions.declare_file(ctx.label.name + ".settings.json")
    ctx.actions.write(settings, json.encode({
        "config": config,
        "layer_names": ["debian minbase + python3 (oci_base_repository)", str(ctx.attr.deps_layer.label), str(ctx.attr.binary.label)],
    }))
    base = ctx.attr.base[OciLayerInfo]
    layers = [base, deps, OciLayerInfo(tar = app_tar, descriptor = app_descriptor, runfiles_paths = [], left_out_paths = [])]
    config_blob = ctx.actions.declare_file(ctx.label.name + ".config.json")
    manifest_blob = ctx.actions.declare_file(ctx.label.name + ".manifest.json")
    digest = ctx.actions.declare_file(ctx.label.name + ".digest")
    args = [ctx.file._packer.path, "image", "--settings", settings.path]
    for layer in layers:
        args += ["--layer", layer.descriptor.path]
    args += ["--config-out", config_blob.path, "--manifest-out", manifest_blob.path, "--digest-out", digest.path]
    ctx.actions.run(
        executable = "python3",
        arguments = args,
        inputs = [settings, ctx.file._packer] + [layer.descriptor for layer in layers],
        outputs = [config_blob, manifest_blob, digest],
        mnemonic = "OciImage",
    )
    layer_tars = [layer.tar for layer in layers]
    return [
        DefaultInfo(
            files = depset([config_blob, manifest_blob, digest]),
            runfiles = ctx.runfiles(files = [config_blob, manifest_blob, digest] + layer_tars),
        ),
        OciImageInfo(repo_tag = ctx.attr.repo_tag, config = config_blob, manifest = manifest_blob, layers = layer_tars, digest = digest),
    ]

oci_py_image = rule(
    implementation = _image_impl,
    attrs = dict(
        _TOOL_ATTRS,
        binary = attr.label(mandatory = True, executable = True, cfg = "target"),
        base = attr.label(mandatory = True, providers = [OciLayerInfo]),
        deps_layer = attr.label(mandatory = True, providers = [OciLayerInfo]),
        repo_tag = attr.string(mandatory = True, doc = "name:tag written into archives"),
        files = attr.label_keyed_string_dict(allow_files = True, doc = "extra files -> absolute path in the image"),
        user = attr.string(default = "10001:10001"),
        workdir = attr.string(default = "/home/cleave"),
        env = attr.string_dict(),
        cmd = attr.string_list(),
        labels = attr.string_dict(),
        exposed_ports = attr.string_list(),
        healthcheck = attr.string_list(doc = "the command, run without a shell"),
        health_interval_s = attr.int(default = 10),
        health_timeout_s = attr.int(default = 10),
        health_start_period_s = attr.int(default = 60),
        health_retries = attr.int(default = 3),
    ),
    doc = "An OCI image: base + shared deps layer + the binary's own runfiles; ENTRYPOINT the binary.",
)

def _archive_impl(ctx):
    out = ctx.actions.declare_file(ctx.label.name + ".tar")
    args = [ctx.file._packer.path, "archive", "--out", out.path]
    inputs = [ctx.file._packer]
    for image in ctx.attr.images:
        info = image[OciImageInfo]
        args += ["--image", "%s=%s" % (info.repo_tag, ",".join([info.config.path, info.manifest.path] + [t.path for t in info.layers]))]
        inputs += [info.config, info.manifest] + info.layers
    ctx.actions.run(
        executable = "python3",
        arguments = args,
        inputs = inputs,
        outputs = [out],
        mnemonic = "OciArchive",
        execution_requirements = {"no-sandbox": "1", "no-remote": "1"},
    )
    return [DefaultInfo(files = depset([out]))]

oci_archive = rule(
    implementation = _archive_impl,
    attrs = dict(_TOOL_ATTRS, images = attr.label_list(mandatory = True, providers = [OciImageInfo])),
    doc = "One tar holding `images` as an OCI layout and a docker-archive (docker/podman load).",
)

def _image_list_impl(ctx):
    """A text file naming each image's pieces by runfiles path, for a loader script."""
    lines, files = [], []
    for image in ctx.attr.images:
        info = image[OciImageInfo]
        pieces = [info.config, info.manifest] + info.layers
        lines.append("%s=%s" % (info.repo_tag, ",".join([_runfiles_path(ctx, f) for f in pieces])))
        files += pieces + [info.digest]
    out = ctx.actions.declare_file(ctx.label.name + ".txt")
    ctx.actions.write(out, "\n".join(lines) + "\n")
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out] + files))]

oci_image_list = rule(
    implementation = _image_list_impl,
    attrs = {"images": attr.label_list(mandatory = True, providers = [OciImageInfo])},
)

def _base_layer_impl(ctx):
    return [
        DefaultInfo(files = depset([ctx.file.tar, ctx.file.descriptor])),
        OciLayerInfo(tar = ctx.file.tar, descriptor = ctx.file.descriptor, runfiles_paths = [], left_out_paths = []),
    ]

oci_layer_import = rule(
    implementation = _base_layer_impl,
    attrs = {
        "tar": attr.label(mandatory = True, allow_single_file = [".tar"]),
        "descriptor": attr.label(mandatory = True, allow_single_file = [".json"]),
    },
    doc = "A layer tar made elsewhere (the base repository) with its descriptor.",
)

def _base_repository_impl(rctx):
    script = rctx.path(rctx.attr._script)
    packer = rctx.path(rctx.attr._packer)
    env = rctx.os.environ
    cache_dir = env.get("CLEAVE_OCI_BASE_CACHE") or (env.get("HOME", "/tmp") + "/.cache/cleave/oci-base")
    rctx.report_progress("Debian %s minbase root file system (cached in %s)" % (rctx.attr.suite, cache_dir))
    result = rctx.execute(
        [
            "bash",
            script,
            str(rctx.path(".")),
            str(packer),
            cache_dir,
            rctx.attr.suite,
            # A dated snapshot (http://snapshot.debian.org/archive/debian/20261201T000000Z) pins
            # every package version; the default mirror gives the suite's current ones.
            env.get("CLEAVE_OCI_BASE_MIRROR") or rctx.attr.mirror,
            ",".join(rctx.attr.packages),
        ],
        timeout = 1800,
        quiet = False,
    )
    if result.return_code != 0:
        fail("building the base image failed (%s):\n%s\n%s" % (script, result.stdout, result.stderr))
    rctx.file("BUILD.bazel", """\
load("@cleave//tools/build_defs:oci.bzl", "oci_layer_import")

oci_layer_import(
    name = "base",
    tar = "base.tar",
    descriptor = "base.json",
    visibility = ["//visibility:public"],
)
""")

oci_base_repository = repository_rule(
    implementation = _base_repository_impl,
    attrs = {
        "suite": attr.string(default = "bookworm"),
        "mirror": attr.string(default = "http://deb.debian.org/debian"),
        "packages": attr.string_list(mandatory = True),
        "_script": attr.label(default = "//tools/build_defs:oci_base.sh"),
        "_packer": attr.label(default = "//tools/build_defs:oci_pack.py"),
    },
    environ = ["CLEAVE_OCI_BASE_CACHE", "CLEAVE_OCI_BASE_MIRROR"],
    doc = "The base layer: `debootstrap --variant=minbase` + packages, packed deterministically; " +
          "kept in ~/.cache/cleave/oci-base keyed by its inputs, so it is built once per machine.",
)

"""Python + gRPC code generated from .proto files at build time (never committed).

Import paths are relative to //protos, so `protos/cleave/worker/v1/worker.proto` becomes
`from cleave.worker.v1 import worker_pb2, worker_pb2_grpc`.
"""

load("//tools/build_defs:py.bzl", "cleave_py_library", "requirement")

def cleave_proto_library(name, srcs, deps = [], visibility = None):
    """Generates <file>_pb2.py, <file>_pb2.pyi and <file>_pb2_grpc.py for each of `srcs`.

    deps: other cleave_proto_library targets whose .proto files these import.
    """
    native.filegroup(
        name = name + "_files",
        srcs = srcs + [d + "_files" for d in deps],
        visibility = visibility,
    )
    outs = []
    for src in srcs:
        stem = src[:-len(".proto")]
        outs += [stem + "_pb2.py", stem + "_pb2.pyi", stem + "_pb2_grpc.py"]
    package_depth = len(native.package_name().split("/"))
    native.genrule(
        name = name + "_gen",
        srcs = [":" + name + "_files"],
        outs = outs,
        tools = ["//tools/protoc"],
        cmd = " ".join([
            "$(location //tools/protoc)",
            "--proto_path=protos",
            "--python_out=$(GENDIR)/protos",
            "--pyi_out=$(GENDIR)/protos",
            "--grpc_python_out=$(GENDIR)/protos",
        ] + ["%s/%s" % (native.package_name(), s) for s in srcs]),
    )
    cleave_py_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".py")],
        data = [o for o in outs if o.endswith(".pyi")],
        # Up from protos/cleave/<service>/v1 to protos/, the root of the import paths.
        imports = ["/".join([".."] * (package_depth - 1))],
        deps = deps + [requirement("protobuf"), requirement("grpcio")],
        visibility = visibility,
    )

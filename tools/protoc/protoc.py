"""protoc from the locked grpcio-tools, with the well-known types on the include path."""

import sys
from importlib import resources

from grpc_tools import protoc

if __name__ == "__main__":
    well_known = str(resources.files("grpc_tools") / "_proto")
    sys.exit(protoc.main(["protoc", f"--proto_path={well_known}", *sys.argv[1:]]))

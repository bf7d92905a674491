"""Entry point of every Bazel py_test: runs pytest on the files passed as arguments.

pytest's exit code 5 ("no tests collected") is turned into a failure, so a test target
that silently stopped collecting tests cannot pass.
"""

import os
import sys

import pytest

if __name__ == "__main__":
    # Bazel runs tests from the workspace root inside the runfiles tree; rooting pytest there
    # makes it load tests/conftest.py for every target.
    # Cleave's async tests run on anyio's plugin; pytest-asyncio (in the lock for vLLM's own
    # tests, tools/vllm_conformance) stays out so that only one plugin drives them.
    args = ["-p", "no:cacheprovider", "-p", "no:asyncio", "--import-mode=importlib", "-q", "-ra"]
    args += [f"--rootdir={os.getcwd()}"]
    args += sys.argv[1:]
    # `bazel test --test_filter=EXPR` arrives here; pytest's -k understands the same names.
    only = os.environ.get("TESTBRIDGE_TEST_ONLY")
    if only:
        args += ["-k", only]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args.append(f"--junitxml={xml}")
    code = pytest.main(args)
    sys.exit(1 if code == pytest.ExitCode.NO_TESTS_COLLECTED else int(code))

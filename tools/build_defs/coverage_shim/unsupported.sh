#!/bin/sh
echo "coverage is not supported in the offline Bazel setup" >&2
exit 1

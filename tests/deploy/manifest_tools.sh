#!/usr/bin/env bash
# The tools tests/deploy validates deploy/ with, from Debian when missing (.ci/run runs it
# before the tests): docker-compose (1.29: `config -q` needs no engine) and kubectl
# (kubernetes-client 1.20: `kubectl kustomize` renders the overlays; no cluster needed).
set -euo pipefail
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
missing=()
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v kubectl >/dev/null || missing+=(kubernetes-client)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "manifest_tools: installing ${missing[*]} from Debian" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2

#!/usr/bin/env bash
# A container engine for the compose smoke test on a fresh Debian 12 machine (.ci/run):
#
#   tests/deploy/container_engine.sh start   # install docker.io, docker-compose, debootstrap
#                                            # from Debian if missing; start dockerd if none runs
#   tests/deploy/container_engine.sh stop    # stop the dockerd that `start` started (if any)
#
# Podman works for the images too (`./bazel run //tools/images -- --engine podman`); it needs
# /etc/containers/containers.conf with runc and ulimits here, which `start` writes if absent.
set -euo pipefail

state_dir=${CLEAVE_ENGINE_STATE:-/tmp/cleave-container-engine}
pid_file=$state_dir/dockerd.pid
log_file=$state_dir/dockerd.log
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
log() { echo "container_engine: $*" >&2; }

install_packages() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v docker-compose >/dev/null || missing+=(docker-compose)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v curl >/dev/null || missing+=(curl)
  [ ${#missing[@]} -eq 0 ] && return
  log "installing ${missing[*]} from Debian"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" iptables tini >&2
}

write_podman_conf() {
  [ -f /etc/containers/containers.conf ] && return
  $sudo mkdir -p /etc/containers
  printf '%s\n' '[containers]' 'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]' '' \
    '[engine]' 'runtime = "runc"' | $sudo tee /etc/containers/containers.conf >/dev/null
}

start() {
  install_packages
  write_podman_conf
  if $sudo docker info >/dev/null 2>&1; then
    log "a docker daemon is already running"
    return
  fi
  mkdir -p "$state_dir"
  log "starting dockerd (log: $log_file)"
  $sudo sh -c "dockerd >'$log_file' 2>&1 & echo \$! >'$pid_file'"
  for _ in $(seq 60); do
    if $sudo docker info >/dev/null 2>&1; then
      log "dockerd $($sudo docker version --format '{{.Server.Version}}') ready"
      return
    fi
    sleep 1
  done
  log "dockerd did not answer within 60 s; its log:"
  tail -40 "$log_file" >&2
  exit 1
}

stop() {
  [ -f "$pid_file" ] || return 0
  local pid
  pid=$(cat "$pid_file")
  log "stopping dockerd (pid $pid)"
  $sudo kill "$pid" 2>/dev/null || true
  for _ in $(seq 30); do
    $sudo kill -0 "$pid" 2>/dev/null || { rm -f "$pid_file"; return 0; }
    sleep 1
  done
  log "dockerd (pid $pid) still running after 30 s"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac

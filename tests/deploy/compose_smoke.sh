#!/usr/bin/env bash
# Brings a compose stack of Cleave's images up, sends one chat completion through its gateway
# on 127.0.0.1, and tears it down, checking that nothing but the model volume is left.
# CI runs it on the 1p1d stack (.ci/run); developers can too, once the images are loaded
# (./bazel run //tools/images):
#
#   tests/deploy/compose_smoke.sh [--compose-file deploy/compose/1p1d/docker-compose.yml]
#       [--project cleave-smoke] [--port 8000] [--up-timeout 1200] [--keep]
#       [--live-checks kill,scale]
#
# --live-checks runs tests/deploy/compose_live_checks.py on the same stack after the chat
# completion (1p1d and 2p1d): kill decode and recover; scale decode to 2 and back.
# Images are taken with tag $CLEAVE_TAG (default latest). Every wait has a timeout; on any
# failure the containers' state and their last log lines are printed before the teardown.
set -euo pipefail
cd "$(dirname "$0")/../.."

compose_file=deploy/compose/1p1d/docker-compose.yml
project=cleave-smoke
port=${CLEAVE_HTTP_PORT:-8000}
up_timeout=1200
request_timeout=300
keep=0
live_checks=""
while [ $# -gt 0 ]; do
  case "$1" in
    --compose-file) compose_file=$2; shift 2 ;;
    --project) project=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --up-timeout) up_timeout=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --live-checks) live_checks=$2; shift 2 ;;
    *) sed -n '2,15p' "$0" >&2; exit 2 ;;
  esac
done
[ -f "$compose_file" ] || { echo "compose_smoke: no compose file $compose_file" >&2; exit 2; }

export CLEAVE_TAG=${CLEAVE_TAG:-latest} CLEAVE_HTTP_PORT=$port
# compose's default 60 s per API call is short for a daemon busy unpacking gigabyte layers.
export COMPOSE_HTTP_TIMEOUT=${COMPOSE_HTTP_TIMEOUT:-300}
compose=(docker-compose --project-name "$project" --file "$compose_file")
# The volume every topology shares for converted models: kept on purpose.
model_volume=cleave-models
log() { echo "compose_smoke: $(date +%T) $*" >&2; }

dump_state() {
  log "state of $project:"
  "${compose[@]}" ps >&2 || true
  for id in $(docker ps -aq --filter "label=com.docker.compose.project=$project"); do
    name=$(docker inspect --format '{{.Name}} {{.State.Status}} health={{if .State.Health}}{{.State.Health.Status}}{{end}} exit={{.State.ExitCode}}' "$id")
    echo "----- $name (last 60 log lines)" >&2
    docker logs --tail 60 "$id" 2>&1 | sed 's/^/    /' >&2 || true
  done
}

teardown() {
  local rc=$?
  if [ -n "${up_pid:-}" ]; then kill "$up_pid" 2>/dev/null && wait "$up_pid" 2>/dev/null || true; fi
  if [ "$rc" -ne 0 ]; then dump_state; fi
  if [ "$keep" -eq 1 ]; then log "--keep: leaving $project up"; exit "$rc"; fi
  log "down"
  timeout 180 "${compose[@]}" down --remove-orphans --timeout 30 >&2 || rc=1
  local left
  left=$(
    docker ps -aq --filter "label=com.docker.compose.project=$project"
    docker network ls -q --filter "label=com.docker.compose.project=$project"
    docker volume ls -q --filter "label=com.docker.compose.project=$project" | grep -vx "$model_volume" || true
  )
  if [ -n "$left" ]; then
    log "left behind after down: $(echo "$left" | tr '\n' ' ')"
    rc=1
  else
    log "down left nothing of $project behind (model volume $model_volume kept)"
  fi
  exit "$rc"
}
trap teardown EXIT

log "validate $compose_file"
"${compose[@]}" config -q

started=$(date +%s)
log "up (CLEAVE_TAG=$CLEAVE_TAG; waits for the services' health checks, at most ${up_timeout}s)"
deadline=$(( started + up_timeout ))
# docker-compose 1.29 gives up on `depends_on: service_healthy` as soon as a dependency is
# unhealthy, even one still loading on a busy machine that turns healthy later; `up` again
# picks up where it stopped, so retry until the deadline (logs are printed if it passes).
# (In the background and waited for, so that a teardown can stop an `up` still creating.)
up() { timeout $(( deadline - $(date +%s) )) "${compose[@]}" up -d >&2 & up_pid=$!; wait "$up_pid"; }
until up; do
  if [ $(( deadline - $(date +%s) )) -le 15 ]; then log "stack not up after ${up_timeout}s"; exit 1; fi
  log "not up yet; containers now:"
  docker ps --filter "label=com.docker.compose.project=$project" --format '    {{.Names}}: {{.Status}}' >&2
  sleep 15
done

log "waiting for the gateway's /ready on 127.0.0.1:$port"
until curl -fsS -o /dev/null --max-time 5 "http://127.0.0.1:$port/ready"; do
  if [ "$(date +%s)" -ge "$deadline" ]; then log "gateway not ready after ${up_timeout}s"; exit 1; fi
  sleep 3
done
log "stack ready after $(( $(date +%s) - started )) s"

reply=$(curl -fsS --max-time "$request_timeout" "http://127.0.0.1:$port/v1/chat/completions" \
  -H 'content-type: application/json' -d '{
    "model": "smollm2", "temperature": 0, "max_tokens": 16,
    "messages": [{"role": "user", "content": "What is the capital of France?"}]}')
echo "$reply" | python3 -c '
import json, sys
reply = json.load(sys.stdin)
text = reply["choices"][0]["message"]["content"]
assert text.strip(), reply
print("compose_smoke: answer:", repr(text), "usage:", reply["usage"], file=sys.stderr)
'
log "chat completion answered through the gateway"

if [ -n "$live_checks" ]; then
  checks_started=$(date +%s)
  # Its own waits are bounded; this bounds the whole (two model loads at most, on CPU).
  timeout 1800 python3 tests/deploy/compose_live_checks.py --project "$project" \
    --compose-file "$compose_file" --port "$port" --checks "$live_checks"
  log "live checks ($live_checks) passed in $(( $(date +%s) - checks_started )) s"
fi

#!/usr/bin/env bash
# Brings a compose stack of Cleave's images up, sends one chat completion through its gateway
# on 127.0.0.1, and tears it down, checking that nothing but the model volume is left.
# CI runs it on the 1p1d stack (.ci/run); developers can too, once the images are loaded
# (./bazel run //tools/images):
#
#   tests/deploy/compose_smoke.sh [--compose-file deploy/compose/1p1d/docker-compose.yml]
#       [--project cleave-smoke] [--port 8000] [--up-timeout 1200] [--keep]
#       [--live-checks security,metrics,kill,scale] [--tiny-vlm] [--image-chat]
#
# --live-checks runs tests/deploy/compose_live_checks.py on the same stack after the chat
# completion (1p1d): the services' mTLS and token and Redis's password from a container on the
# stack's network; vLLM's metric names on a worker's scrape; kill decode and recover; scale
# decode to 2 and back, the second one drained under streams. `rolling` and `soak` are the
# long checks (by hand: docs/deploy.md).
# The encode stacks (1e1pd, 1e1p1d) serve $CLEAVE_VLM_MODEL; --tiny-vlm writes the encoder
# tests' tiny random vision-language model (//tests/deploy:write_tiny_vlm, with ./bazel) into
# the model volume as /models/tiny-vlm and serves that. --image-chat also sends a chat with a
# data: URL PNG and checks that the gateway had the encoder encode it.
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
tiny_vlm=0
image_chat=0
while [ $# -gt 0 ]; do
  case "$1" in
    --compose-file) compose_file=$2; shift 2 ;;
    --project) project=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --up-timeout) up_timeout=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --live-checks) live_checks=$2; shift 2 ;;
    --tiny-vlm) tiny_vlm=1; shift ;;
    --image-chat) image_chat=1; shift ;;
    *) sed -n '2,22p' "$0" >&2; exit 2 ;;
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
  # The stack's secrets volume outlives `down` on purpose (a restarted stack keeps its
  # secrets); a smoke stack's are thrown away with it.
  docker volume rm "${project}_secrets" >/dev/null 2>&1 || true
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

if [ "$tiny_vlm" -eq 1 ]; then
  export CLEAVE_VLM_MODEL=/models/tiny-vlm
  vlm_started=$(date +%s)
  if docker run --rm -v "$model_volume:/models" --entrypoint test "cleave-encoder:$CLEAVE_TAG" \
      -e /models/tiny-vlm/config.json; then
    log "the model volume already holds /models/tiny-vlm"
  else
    vlm_dir=$(mktemp -d)
    ./bazel run //tests/deploy:write_tiny_vlm -- "$vlm_dir/tiny-vlm" >&2
    # The container's user (uid 10001) reads it; the copy is renamed into place, so an
    # interrupted copy is never taken for the model.
    chmod -R a+rX "$vlm_dir"
    docker run --rm -v "$model_volume:/models" -v "$vlm_dir:/src:ro" --entrypoint sh \
      "cleave-encoder:$CLEAVE_TAG" -c \
      'rm -rf /models/.tiny-vlm.part && cp -r /src/tiny-vlm /models/.tiny-vlm.part && mv /models/.tiny-vlm.part /models/tiny-vlm'
    rm -rf "$vlm_dir"
    log "wrote the tiny VLM into $model_volume:/models/tiny-vlm in $(( $(date +%s) - vlm_started )) s"
  fi
fi

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

model=$(curl -fsS --max-time 10 "http://127.0.0.1:$port/v1/models" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
log "the gateway serves $model"
reply=$(curl -fsS --max-time "$request_timeout" "http://127.0.0.1:$port/v1/chat/completions" \
  -H 'content-type: application/json' -d '{
    "model": "'"$model"'", "temperature": 0, "max_tokens": 16,
    "messages": [{"role": "user", "content": "What is the capital of France?"}]}')
echo "$reply" | python3 -c '
import json, sys
reply = json.load(sys.stdin)
text = reply["choices"][0]["message"]["content"]
assert text.strip(), reply
print("compose_smoke: answer:", repr(text), "usage:", reply["usage"], file=sys.stderr)
'
log "chat completion answered through the gateway"

if [ "$image_chat" -eq 1 ]; then
  image_started=$(date +%s)
  timeout $(( request_timeout + 30 )) python3 tests/deploy/compose_image_chat.py --port "$port" \
    --model "$model" --timeout "$request_timeout"
  log "image chat answered through the gateway in $(( $(date +%s) - image_started )) s"
fi

if [ -n "$live_checks" ]; then
  checks_started=$(date +%s)
  # Its own waits are bounded; this bounds the whole (two model loads at most, on CPU; a soak
  # adds its --soak-seconds).
  timeout "${CLEAVE_LIVE_CHECKS_TIMEOUT:-1800}" python3 tests/deploy/compose_live_checks.py --project "$project" \
    --compose-file "$compose_file" --port "$port" --checks "$live_checks"
  log "live checks ($live_checks) passed in $(( $(date +%s) - checks_started )) s"
fi

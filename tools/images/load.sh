#!/usr/bin/env bash
# ./bazel run //tools/images [-- --engine docker|podman] [--tag TAG]
# Loads Cleave's images (built by this target's data) into docker or podman, tags them
# `latest`, with the source revision (git short sha, "-dirty" with uncommitted changes) and
# with the set's content tag (c-<12 hex of the images' ids>), and prints each image's id (its
# config digest) and size, then `CLEAVE_TAG=<content tag>`.
set -euo pipefail

engine="${CLEAVE_ENGINE:-}"
tag=""
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) engine=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    *) echo "usage: images [--engine docker|podman] [--tag TAG]" >&2; exit 2 ;;
  esac
done

runfiles="${RUNFILES_DIR:-$0.runfiles}"
list="$runfiles/cleave/tools/images/image_list.txt"
packer="$runfiles/cleave/tools/build_defs/oci_pack.py"

if [ -z "$engine" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then engine=docker
  elif command -v podman >/dev/null; then engine=podman
  else echo "images: neither a running docker nor podman found" >&2; exit 1
  fi
fi
if [ -z "$tag" ]; then
  src="${BUILD_WORKSPACE_DIRECTORY:-.}"
  tag=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)
  if [ -n "$(git -C "$src" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    tag="$tag-dirty"
  fi
fi

args=()
while IFS= read -r line; do
  [ -n "$line" ] || continue
  ref=${line%%=*} pieces=${line#*=} paths=()
  IFS=, read -r -a rel <<<"$pieces"
  for p in "${rel[@]}"; do paths+=("$runfiles/$p"); done
  args+=(--image "$ref=$(IFS=,; echo "${paths[*]}")")
done <"$list"

echo "images: streaming $(( ${#args[@]} / 2 )) images into $engine load" >&2
start=$(date +%s)
python3 "$packer" archive "${args[@]}" --out - | "$engine" load
echo "images: loaded in $(( $(date +%s) - start )) s" >&2

# The content tag: one tag for the whole set, derived from every image's id (its config
# digest, which covers its layers), so it names exactly these bytes and never moves to others.
ids=""
while IFS= read -r line; do
  [ -n "$line" ] || continue
  expected=$(sed -n 's/^image id (config digest) //p' "$runfiles/$(echo "${line#*=}" | cut -d, -f1 | sed 's/\.config\.json$/.digest/')")
  ids+="${line%%=*}=${expected#sha256:}"$'\n'
done <"$list"
content_tag="c-$(printf '%s' "$ids" | sort | sha256sum | cut -c1-12)"

printf '%-18s %-34s %-73s %s\n' IMAGE TAGS "ID (config digest)" SIZE
while IFS= read -r line; do
  [ -n "$line" ] || continue
  ref=${line%%=*} name=${ref%%:*}
  "$engine" tag "$ref" "$name:$tag"
  "$engine" tag "$ref" "$name:$content_tag"
  expected=$(sed -n 's/^image id (config digest) //p' "$runfiles/$(echo "${line#*=}" | cut -d, -f1 | sed 's/\.config\.json$/.digest/')")
  read -r id size < <("$engine" image inspect --format '{{.Id}} {{.Size}}' "$ref")
  [ "${id#sha256:}" = "${expected#sha256:}" ] || { echo "images: $ref loaded as $id, built as $expected" >&2; exit 1; }
  printf '%-18s %-34s %-73s %s MB\n' "$name" "latest,$tag,$content_tag" "sha256:${id#sha256:}" "$(( size / 1000000 ))"
done <"$list"
echo "images: content tag of this set: $content_tag (CLEAVE_TAG=$content_tag for compose; --image-tag $content_tag for //tools/deploy_secrets --kustomize)" >&2
echo "CLEAVE_TAG=$content_tag"

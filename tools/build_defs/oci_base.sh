#!/usr/bin/env bash
# The base layer of Cleave's images (run by oci_base_repository in oci.bzl):
#   oci_base.sh OUT_DIR PACKER CACHE_DIR SUITE MIRROR PACKAGES(comma-separated)
# debootstraps a Debian minbase root file system with PACKAGES, adds the `cleave` user
# (uid/gid 10001), the /models and /etc/cleave/secrets volume directories, and packs it
# deterministically into
# OUT_DIR/base.tar (+ base.json, its descriptor).
#
# The result is kept in CACHE_DIR under a key of every input (this script, the packer, the
# suite, mirror and packages), so it is built once per machine (~1 min) and survives
# `bazel clean --expunge`; delete the cache directory to rebuild it. debootstrap needs root:
# run as root, or with passwordless sudo.
set -euo pipefail

out_dir=$1 packer=$2 cache_dir=$3 suite=$4 mirror=$5 packages=$6

key=$(cat "$0" "$packer" <(printf '%s\n' "$suite" "$mirror" "$packages") | sha256sum | cut -c1-32)
cached="$cache_dir/$key"

if [ ! -f "$cached/base.json" ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    sudo -n true 2>/dev/null || { echo "oci_base: debootstrap needs root or passwordless sudo" >&2; exit 1; }
    sudo="sudo -n"
  fi
  command -v debootstrap >/dev/null || { echo "oci_base: install debootstrap (apt-get install debootstrap)" >&2; exit 1; }
  mkdir -p "$cache_dir"
  work=$(mktemp -d "$cache_dir/build.XXXXXX")
  trap '$sudo rm -rf "$work"' EXIT
  echo "oci_base: debootstrap --variant=minbase $suite ($packages) into $work" >&2
  $sudo debootstrap --variant=minbase --include="$packages" "$suite" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -30 "$work/debootstrap.log" >&2; exit 1; }
  root="$work/rootfs"
  $sudo chroot "$root" /usr/sbin/groupadd --gid 10001 cleave
  $sudo chroot "$root" /usr/sbin/useradd --uid 10001 --gid 10001 --home-dir /home/cleave \
    --create-home --shell /usr/sbin/nologin cleave
  $sudo install -d -o 10001 -g 10001 -m 0755 "$root/models"
  # The deployment's secrets volume (compose's init step writes it as uid 10001; a new volume
  # takes this folder's owner and mode).
  $sudo install -d -m 0755 "$root/etc/cleave"
  $sudo install -d -o 10001 -g 10001 -m 0700 "$root/etc/cleave/secrets"
  # What the base holds, package by package: the image carries its own manifest, and
  # base.json names its digest, so a deployment pinned to a content tag pins these too.
  $sudo sh -c "chroot '$root' dpkg-query -W -f '\${Package}=\${Version}\n' | sort > '$root/usr/share/cleave-base-packages.txt'"
  # Records of the day it was built, not of what is installed.
  $sudo chroot "$root" /usr/bin/apt-get clean
  $sudo rm -rf "$root"/var/lib/apt/lists/* "$root"/var/log/* "$root"/var/cache/debconf/*-old \
    "$root"/var/lib/dpkg/*-old
  # /etc/shadow and /etc/gshadow record the day of each password change.
  $sudo sed -i -E 's/^([^:]*:[^:]*):[0-9]+:/\1:0:/' "$root/etc/shadow"
  $sudo python3 "$packer" rootfs --dir "$root" --out "$work/base.tar" --descriptor "$work/base.json"
  $sudo chown "$(id -u):$(id -g)" "$work/base.tar" "$work/base.json"
  mkdir -p "$cached"
  mv "$work/base.tar" "$cached/base.tar"
  mv "$work/base.json" "$cached/base.json"
fi

# A hard link when the cache shares the file system with Bazel's output base, else a copy.
for f in base.tar base.json; do
  ln -f "$cached/$f" "$out_dir/$f" 2>/dev/null || cp "$cached/$f" "$out_dir/$f"
done
echo "oci_base: $(cat "$out_dir/base.json")" >&2

#!/usr/bin/env bash
# What the container tests (tests/federation/test_compose_podman.py, the offline build in
# docs/deployment.md) need: podman, podman-compose and runc; a local Debian base image with Python 3.11
# (debootstrap, so nothing is pulled from a registry); and a wheelhouse of fedsbdt's dependencies for
# the offline image build. The base image's root file system and the wheelhouse are cached in
# $FEDSBDT_CI_CACHE (default /var/cache/fedsbdt-ci) between runs.
#
# Never fails CI: when something cannot be set up it says so, and the container tests skip with the reason.
set -uo pipefail
cd "$(dirname "$0")/.."
cache="${FEDSBDT_CI_CACHE:-/var/cache/fedsbdt-ci}"
base="${FEDSBDT_BASE_IMAGE:-localhost/fedsbdt-base:bookworm}"
python="${PYTHON:-$(command -v python3.11 || echo python)}"  # the image's Python: 3.11
say() { echo ".ci/container-setup: $*" >&2; }

install_packages() {
  local missing=()
  for tool in podman podman-compose runc debootstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
  say "installing podman runc podman-compose debootstrap (missing: ${missing[*]})"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
    podman runc podman-compose debootstrap >/dev/null
}

# In some sandboxes podman's default rlimits (nofile, nproc above the hard limits) cannot be set,
# and crun cannot set them at all: use runc and limits within the current hard limits.
configure_runtime() {
  podman run --rm --network none "$base" true >/dev/null 2>&1 && return 0
  local conf=/etc/containers/containers.conf.d/50-fedsbdt-ci.conf nofile
  nofile=$(ulimit -Hn)
  [ "$nofile" = unlimited ] && nofile=1048576
  say "podman cannot start a container with its defaults; writing $conf (runc, nofile=$nofile, nproc=4096)"
  mkdir -p "$(dirname "$conf")" && cat >"$conf" <<EOF
# written by fedsbdt's .ci/container-setup.sh
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=4096:4096"]
[engine]
runtime = "runc"
EOF
  podman run --rm --network none "$base" true
}

base_image() {
  podman image exists "$base" && return 0
  local tar="$cache/base-bookworm.tar"
  if [ ! -s "$tar" ]; then
    say "making the base image with debootstrap (once; cached in $tar)"
    local root
    root=$(mktemp -d)
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip bookworm "$root" \
      http://deb.debian.org/debian >/dev/null || { rm -rf "$root"; return 1; }
    tar -C "$root" -c . >"$tar.tmp" && mv "$tar.tmp" "$tar"
    rm -rf "$root"
  fi
  podman import "$tar" "$base" >/dev/null
}

# The dependencies' wheels (and the build backend's), as a hospital prepares them on a connected machine.
# Made again only when pyproject.toml (the dependencies) changes.
wheelhouse() {
  local stamp="$cache/wheels/.pyproject.sha256" want
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && return 0
  "$python" -m pip wheel -q --wheel-dir "$cache/wheels" --find-links "$cache/wheels" . setuptools wheel &&
    rm -f "$cache/wheels"/fedsbdt-*.whl && echo "$want" >"$stamp"
}

main() {
  install_packages || { say "could not install podman; the container tests will skip"; return 0; }
  mkdir -p "$cache" || return 1
  base_image || { say "no base image; the container tests will skip"; return 0; }
  configure_runtime || { say "podman cannot start containers here; the container tests will skip"; return 0; }
  wheelhouse || say "no wheelhouse; the container tests will skip"
  say "ready: podman $(podman version --format '{{.Client.Version}}'), base image $base, wheels in $cache/wheels"
}

main
exit 0

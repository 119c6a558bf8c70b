#!/usr/bin/env bash
# Starts a Docker engine for the tests and makes the local base image, (docs/architecture.md, Tests).
#
# Idempotent and non-interactive (run as root, CI=true, no stdin):
#   - an engine that already answers is left alone;
#   - otherwise dockerd starts in the background WITHOUT a bridge (tests may only reach loopback,
#     so containers get `--network none` or `host`), logging to $DOCKERD_LOG;
#   - the storage driver is overlay2 when the kernel and backing filesystem allow it, vfs otherwise;
#   - debian:bookworm-slim is made locally with debootstrap (there is no registry to pull from),
#     from the Debian mirror this machine's apt already uses (see debian_mirror below).
#
# `docker-up.sh --print-mirror` prints the mirror it would use and exits.
#
# Exit status: 0 when the engine answers and the base image exists, non-zero with a message otherwise.
set -euo pipefail

DOCKERD_LOG="${DOCKERD_LOG:-/var/log/meepa-dockerd.log}"
DOCKER_DATA_ROOT="${DOCKER_DATA_ROOT:-/var/lib/docker}"
BASE_IMAGE="${BASE_IMAGE:-debian:bookworm-slim}"
ENGINE_WAIT_SECONDS="${ENGINE_WAIT_SECONDS:-60}"
APT_ETC="${APT_ETC:-/etc/apt}"
DEFAULT_DEBIAN_MIRROR="http://deb.debian.org/debian"

log() { printf 'docker-up: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The first Debian archive URI in the machine's apt sources (one-line .list or deb822 .sources):
# a machine behind another mirror or an apt proxy builds the image through the same path.
# Security and updates suites live elsewhere; cdrom/file sources cannot serve debootstrap.
debian_mirror() {
  local files=() file
  [ -f "$APT_ETC/sources.list" ] && files+=("$APT_ETC/sources.list")
  for file in "$APT_ETC"/sources.list.d/*.list "$APT_ETC"/sources.list.d/*.sources; do
    [ -f "$file" ] && files+=("$file")
  done
  local found=""
  if [ "${#files[@]}" -gt 0 ]; then
    found="$(awk '
      function debian_suite(s) { return s ~ /^(bookworm|bullseye|buster|trixie|forky|sid|stable|testing|unstable|oldstable)$/ }
      function usable(uri) { return uri ~ /^https?:\/\// && uri !~ /security/ }
      function flush() {
        if (types ~ /(^| )deb( |$)/ && enabled != "no") {
          n = split(uris, u, " "); m = split(suites, s, " ")
          for (i = 1; i <= n; i++) for (j = 1; j <= m; j++) if (usable(u[i]) && debian_suite(s[j])) { print u[i]; exit }
        }
        types = uris = suites = enabled = ""
      }
      FNR == 1 { flush() }
      FILENAME ~ /\.sources$/ {
        if ($0 ~ /^[ \t]*$/) { flush(); next }
        if ($0 ~ /^[ \t]*#/) next
        key = tolower($1); sub(/:$/, "", key); value = $0; sub(/^[^:]*:[ \t]*/, "", value)
        if (key == "types") types = value; else if (key == "uris") uris = value
        else if (key == "suites") suites = value; else if (key == "enabled") enabled = tolower(value)
        next
      }
      $1 == "deb" {
        k = 2
        if ($k ~ /^\[/) { while (k <= NF && $k !~ /\]$/) k++; k++ }
        if (usable($k) && debian_suite($(k + 1))) { print $k; exit }
      }
      END { flush() }
    ' "${files[@]}" 2>/dev/null | head -n 1)"
  fi
  echo "${found:-$DEFAULT_DEBIAN_MIRROR}"
}

DEBIAN_MIRROR="${DEBIAN_MIRROR:-$(debian_mirror)}"
if [ "${1:-}" = "--print-mirror" ]; then echo "$DEBIAN_MIRROR"; exit 0; fi

# `docker info` itself hangs when the engine hangs: always bound it.
engine_answers() { timeout 10 docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; }

pick_storage_driver() {
  if [ -n "${DOCKER_STORAGE_DRIVER:-}" ]; then echo "$DOCKER_STORAGE_DRIVER"; return; fi
  # An existing data root keeps its driver: switching would hide every image already built.
  if [ -d "$DOCKER_DATA_ROOT/overlay2" ] && [ -n "$(ls -A "$DOCKER_DATA_ROOT/overlay2" 2>/dev/null)" ]; then echo overlay2; return; fi
  if [ -d "$DOCKER_DATA_ROOT/vfs" ] && [ -n "$(ls -A "$DOCKER_DATA_ROOT/vfs" 2>/dev/null)" ]; then echo vfs; return; fi
  # Probe: overlayfs with a lower, upper and work dir on the data root's filesystem.
  modprobe overlay >/dev/null 2>&1 || true
  mkdir -p "$DOCKER_DATA_ROOT"
  local probe
  probe="$(mktemp -d "$DOCKER_DATA_ROOT/.overlay-probe.XXXXXX")"
  mkdir -p "$probe/lower" "$probe/upper" "$probe/work" "$probe/merged"
  local driver=vfs
  if mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" "$probe/merged" 2>/dev/null; then
    if touch "$probe/merged/ok" 2>/dev/null; then driver=overlay2; fi
    umount "$probe/merged" 2>/dev/null || true
  fi
  rm -rf "$probe"
  echo "$driver"
}

start_engine() {
  command -v dockerd >/dev/null || die "dockerd is not installed (apt-get install -y docker.io)"
  local driver
  driver="$(pick_storage_driver)"
  log "starting dockerd (storage driver $driver, no bridge), log: $DOCKERD_LOG"
  mkdir -p "$(dirname "$DOCKERD_LOG")"
  # setsid + nohup: the engine must outlive this script and the CI step that ran it.
  setsid nohup dockerd \
    --bridge=none --iptables=false --ip-masq=false \
    --storage-driver="$driver" --data-root="$DOCKER_DATA_ROOT" \
    >>"$DOCKERD_LOG" 2>&1 </dev/null &
  wait_for_engine
}

build_base_image() {
  command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install -y debootstrap)"
  local root
  root="$(mktemp -d /var/tmp/meepa-bookworm.XXXXXX)"
  trap 'rm -rf "$root"' RETURN
  log "building $BASE_IMAGE with debootstrap from $DEBIAN_MIRROR (a few minutes)"
  timeout 1200 debootstrap --variant=minbase bookworm "$root" "$DEBIAN_MIRROR" >&2 \
    || die "debootstrap failed; check that $DEBIAN_MIRROR is reachable"
  # Like the official slim image: no apt lists or caches, and sources pointing at the mirror.
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
  # a root folder of 0755, as Debian has it: mktemp made it 0700, which Podman applies from the layer
  chmod 0755 "$root"
  printf 'deb %s bookworm main\n' "$DEBIAN_MIRROR" >"$root/etc/apt/sources.list"
  tar -C "$root" -c . | timeout 600 docker import \
    --change 'CMD ["bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - "$BASE_IMAGE" >/dev/null
  log "imported $BASE_IMAGE"
}

wait_for_engine() {
  local waited=0
  until engine_answers; do
    if [ "$waited" -ge "$ENGINE_WAIT_SECONDS" ]; then
      tail -n 30 "$DOCKERD_LOG" >&2 2>/dev/null || true
      die "the Docker engine did not answer within ${ENGINE_WAIT_SECONDS} s (log: $DOCKERD_LOG)"
    fi
    sleep 1
    waited=$((waited + 1))
  done
  log "engine up after ${waited} s"
}

# A dockerd that is still starting (or wedged) owns the pid file: wait for it instead of
# starting a second one, which would fail on the pid file and the socket.
running_dockerd_pid() {
  local pid
  pid="$(cat /var/run/docker.pid 2>/dev/null || true)"
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then echo "$pid"; fi
}

if engine_answers; then
  log "engine already answers ($(timeout 10 docker info --format '{{.ServerVersion}} {{.Driver}}' 2>/dev/null))"
elif [ -n "$(running_dockerd_pid)" ]; then
  log "dockerd (pid $(running_dockerd_pid)) is running but not answering yet; waiting"
  wait_for_engine
else
  start_engine
fi

if timeout 30 docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  log "$BASE_IMAGE present"
else
  build_base_image
fi

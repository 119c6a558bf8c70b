#!/usr/bin/env bash
# Starts a rootless Podman engine for the tests (docs/architecture.md, "Engines").
#
# Idempotent and non-interactive (run as root, CI=true, no stdin):
#   - podman, runc, uidmap and slirp4netns come from Debian (installed by .ci/run);
#   - a dedicated non-root user ($PODMAN_USER) with its own subuid/subgid range owns the engine;
#   - that user's `podman system service` listens on $PODMAN_SOCKET (a folder only it and root
#     can enter: root, the gateway, connects; nobody else can);
#   - a service that already answers is left alone.
#
# Images reach that user's storage from the local Docker engine (`docker save | podman load`),
# done by the tests that need them (test/helpers/podman-engine.ts), never from a registry.
#
# Exit status: 0 when the service answers, non-zero with a message otherwise.
set -euo pipefail

log() { printf 'podman-up: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

PODMAN_USER="${PODMAN_USER:-meepa-podman}"
PODMAN_RUN_DIR="${PODMAN_RUN_DIR:-/run/meepa-podman}"
PODMAN_SOCKET="$PODMAN_RUN_DIR/podman.sock"
PODMAN_LOG="${PODMAN_LOG:-/var/log/meepa-podman.log}"
WAIT_SECONDS="${WAIT_SECONDS:-30}"

command -v podman >/dev/null || die "podman is not installed (apt-get install -y podman uidmap slirp4netns)"
command -v newuidmap >/dev/null || die "newuidmap is missing (apt-get install -y uidmap)"

if ! id "$PODMAN_USER" >/dev/null 2>&1; then
  log "creating user $PODMAN_USER"
  useradd --system --create-home --home-dir "/var/lib/$PODMAN_USER" --shell /usr/sbin/nologin "$PODMAN_USER"
fi
uid="$(id -u "$PODMAN_USER")"
home="$(getent passwd "$PODMAN_USER" | cut -d: -f6)"

# 65536 ids of its own, past every other range (and far above real users): the container's uids map there.
for file in /etc/subuid /etc/subgid; do
  touch "$file"
  if ! grep -q "^$PODMAN_USER:" "$file"; then
    start="$(awk -F: 'BEGIN { m = 2000000000 } { if ($2 + $3 > m) m = $2 + $3 } END { print m }' "$file")"
    echo "$PODMAN_USER:$start:65536" >>"$file"
    log "gave $PODMAN_USER the ids $start-$((start + 65535)) in $file"
  fi
done

# Its runtime dir (XDG_RUNTIME_DIR) holds the socket; 0700 so only it (and root) get in.
install -d -o "$PODMAN_USER" -g "$(id -g "$PODMAN_USER")" -m 0700 "$PODMAN_RUN_DIR"

as_user() {
  (cd / && setpriv --reuid="$uid" --regid="$(id -g "$PODMAN_USER")" --init-groups \
    env -i HOME="$home" USER="$PODMAN_USER" LOGNAME="$PODMAN_USER" PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    XDG_RUNTIME_DIR="$PODMAN_RUN_DIR" "$@")
}

answers() { timeout 10 curl -sf --unix-socket "$PODMAN_SOCKET" http://d/_ping >/dev/null 2>&1; }

if answers; then
  log "podman service already answers on $PODMAN_SOCKET"
  exit 0
fi

# runc on cgroup v1 and hybrid hosts: crun (which Podman prefers when both are installed) refuses
# hybrid ones, "cgroups in hybrid mode not supported", and every container create then fails
runtime=""
if [ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ]; then
  command -v runc >/dev/null || die "runc is missing, and crun cannot run on this host's cgroup v1 (apt-get install -y runc)"
  runtime='runtime = "runc"'
fi

# cgroupfs: without a systemd user session there is no systemd to delegate to; events to a file for the same reason
mkdir -p "$home/.config/containers"
cat >"$home/.config/containers/containers.conf" <<EOF
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
$runtime
[containers]
log_driver = "k8s-file"
EOF
# native overlay (rootless since Linux 5.13): vfs would copy every layer whole, minutes per image build
if [ ! -e "$home/.config/containers/storage.conf" ]; then
  printf '[storage]\ndriver = "overlay"\n' >"$home/.config/containers/storage.conf"
fi
chown -R "$PODMAN_USER:" "$home/.config"

if ! as_user podman info --format '{{.Store.GraphDriverName}}' >/dev/null 2>&1; then
  log "native overlay is not usable here; falling back to Podman's default storage"
  rm -f "$home/.config/containers/storage.conf"
  as_user podman system reset -f >/dev/null 2>&1 || true
fi
as_user podman system migrate >/dev/null 2>&1 || true
log "starting podman system service for $PODMAN_USER on unix://$PODMAN_SOCKET, log: $PODMAN_LOG"
touch "$PODMAN_LOG"
chown "$PODMAN_USER" "$PODMAN_LOG"
# setsid + nohup: the service must outlive this script and the CI step that ran it
as_user setsid nohup podman system service --time=0 "unix://$PODMAN_SOCKET" >>"$PODMAN_LOG" 2>&1 </dev/null &

waited=0
until answers; do
  if [ "$waited" -ge "$WAIT_SECONDS" ]; then
    tail -n 30 "$PODMAN_LOG" >&2 || true
    die "the podman service did not answer within ${WAIT_SECONDS} s (log: $PODMAN_LOG)"
  fi
  sleep 1
  waited=$((waited + 1))
done
log "podman service up after ${waited} s ($(as_user podman version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"

#!/usr/bin/env bash
# Makes the Dockerfile's base image, docker.io/library/debian:bookworm-slim, locally from
# Debian's packages (debootstrap --variant=minbase bookworm) and imports it with podman, for
# hosts that reach Debian's mirror but no container registry. Like the official slim image it
# leaves out documentation, man pages and locales (also for packages installed later) and keeps
# no apt lists. Skips the work if the image already exists (--force remakes it).
#
# Usage: deploy/make-base-image.sh [--force]
# Environment: BASE_IMAGE (default docker.io/library/debian:bookworm-slim),
#              DEBIAN_MIRROR (default http://deb.debian.org/debian), plus podman's own
#              CONTAINERS_CONF / CONTAINERS_STORAGE_CONF.
set -euo pipefail

BASE_IMAGE="${BASE_IMAGE:-docker.io/library/debian:bookworm-slim}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
FORCE=0
case "${1:-}" in
  --force) FORCE=1 ;;
  "") ;;
  *) echo "make-base-image.sh: unknown argument '$1' (usage: [--force])" >&2; exit 2 ;;
esac

if ((!FORCE)) && podman image exists "$BASE_IMAGE"; then
  echo "[base-image] $BASE_IMAGE present"
  exit 0
fi
[[ $EUID -eq 0 ]] || { echo "make-base-image.sh: debootstrap needs root" >&2; exit 1; }

rootfs="$(mktemp -d /var/tmp/attnserve-rootfs.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT
echo "[base-image] debootstrap --variant=minbase bookworm ($DEBIAN_MIRROR)"
debootstrap --variant=minbase bookworm "$rootfs" "$DEBIAN_MIRROR" > "$rootfs.log" 2>&1 ||
  { tail -20 "$rootfs.log" >&2; rm -f "$rootfs.log"; exit 1; }
rm -f "$rootfs.log"

# The same suites as a Debian 12 host, so the image gets security updates too.
rm -f "$rootfs/etc/apt/sources.list"
cat > "$rootfs/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $DEBIAN_MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
# What the official slim image leaves out, for this and every later dpkg run.
cat > "$rootfs/etc/dpkg/dpkg.cfg.d/slim" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
DPKG
cat > "$rootfs/etc/apt/apt.conf.d/docker-clean" <<'APT'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
Acquire::GzipIndexes "true";
APT
find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
rm -rf "$rootfs"/usr/share/{man,info,locale,lintian}/* "$rootfs"/var/cache/apt/archives/*.deb \
  "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* \
  "$rootfs"/tmp/* "$rootfs"/etc/machine-id "$rootfs"/etc/hostname

podman image rm -f "$BASE_IMAGE" > /dev/null 2>&1 || true
tar -C "$rootfs" --numeric-owner -c . |
  podman import --change 'CMD ["bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --quiet - "$BASE_IMAGE" > /dev/null
echo "[base-image] imported $BASE_IMAGE ($(podman image inspect --format '{{.Size}}' "$BASE_IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"

#!/bin/sh
# Install (as root) or name (otherwise) the system packages umprov's demo and tests need on
# Debian/Ubuntu: a Docker engine, debootstrap for the lab image, OpenSSH client for the lab
# tests, python3-venv, dpkg-dev/apt-utils/gpg for the lab's stand-in apt repository.
set -eu
need=""
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
have dockerd || need="$need docker.io"
have debootstrap || need="$need debootstrap"
have ssh || need="$need openssh-client"
have dpkg-deb || need="$need dpkg-dev"
have apt-ftparchive || need="$need apt-utils"
have gpg || need="$need gnupg"
have gpgv || need="$need gpgv"
# The lab registry (`umprov lab up --registry`, the --pull tests) runs Debian's registry binary.
[ -x /usr/bin/docker-registry ] || need="$need docker-registry"
python3 -c 'import ensurepip, venv' 2>/dev/null || need="$need python3-venv"
have make || need="$need make"
have chromium || need="$need chromium"  # tests/browser: the HTML report in a real browser
[ -z "$need" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "umprov needs these system packages; install them as root:" >&2
  echo "  apt-get install -y$need" >&2
  exit 5
fi
echo "installing system packages:$need" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $need >/dev/null
case "$need" in
  *docker-registry*)
    # Only the binary is wanted (the lab runs it in a container): no registry service here.
    if [ -d /run/systemd/system ]; then systemctl disable --now docker-registry >/dev/null 2>&1 || true; fi
    ;;
esac

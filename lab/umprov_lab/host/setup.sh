#!/bin/sh
set -eu
rm -f /etc/apt/sources.list
cat > /etc/apt/sources.list.d/debian.sources <<'SRC'
Types: deb
URIs: @MIRROR@
Suites: @SUITE@ @SUITE@-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
printf 'APT::Install-Recommends "false";\n' > /etc/apt/apt.conf.d/90lab-no-recommends
groupadd --system docker
useradd --create-home --shell /bin/bash --groups sudo,docker @LAB_USER@
passwd --lock @LAB_USER@
printf '@LAB_USER@ ALL=(ALL) NOPASSWD:ALL\n' > /etc/sudoers.d/@LAB_USER@
chmod 0440 /etc/sudoers.d/@LAB_USER@
cat > /etc/ssh/sshd_config.d/10-lab.conf <<'SSHD'
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
UseDNS no
SSHD
# Every container makes its own host keys at first boot, before sshd starts.
rm -f /etc/ssh/ssh_host_*
cat > /etc/systemd/system/lab-ssh-hostkeys.service <<'UNIT'
[Unit]
Description=Generate this lab host's SSH host keys
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=multi-user.target
UNIT
systemctl enable lab-ssh-hostkeys.service ssh.service
# Units that have no meaning in a container, and apt timers that would race the tests for
# the apt lock at random moments.
systemctl mask getty.target console-getty.service systemd-udevd.service \
  systemd-udevd-kernel.socket systemd-udevd-control.socket systemd-modules-load.service \
  sys-kernel-config.mount sys-kernel-debug.mount systemd-remount-fs.service \
  apt-daily.timer apt-daily-upgrade.timer
: > /etc/machine-id
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/lib/apt/periodic/*
# An emptied list folder must look old, as on a host that never ran apt-get update, or apt
# clients that trust its age (Ansible's cache_valid_time) skip the update.
touch -d @0 /var/lib/apt/lists

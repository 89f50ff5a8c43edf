#!/bin/sh
# Create (or adopt) the login user with the given uid/gid, owning /workspace.
#   user-setup.sh NAME UID GID
set -eu
name=$1
uid=$2
gid=$3
# Some bases already have a uid 1000 (ubuntu:24.04 has "ubuntu"): rename it rather than fail.
old_user=$(getent passwd "$uid" | cut -d: -f1 || true)
old_group=$(getent group "$gid" | cut -d: -f1 || true)
if [ -n "$old_group" ] && [ "$old_group" != "$name" ]; then
    groupmod -n "$name" "$old_group"
elif [ -z "$old_group" ]; then
    groupadd -g "$gid" "$name"
fi
if [ -n "$old_user" ] && [ "$old_user" != "$name" ]; then
    usermod -l "$name" -d "/home/$name" -m -g "$gid" -s /bin/bash "$old_user"
elif [ -z "$old_user" ]; then
    useradd -m -u "$uid" -g "$gid" -s /bin/bash "$name"
fi
# '*': no password can ever match, yet the account is not "locked" ('!'), which sshd without
# PAM would treat as a reason to refuse even key logins.
usermod -p '*' "$name"
mkdir -p /workspace /etc/ssh/keys /etc/ssh/authorized_keys
chown "$uid:$gid" /workspace
chmod 0755 /workspace
chmod 0700 /etc/ssh/keys
chmod 0755 /etc/ssh/authorized_keys
mkdir -p /etc/umprov && chmod 0755 /etc/umprov

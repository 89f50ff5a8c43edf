#!/bin/bash
# umprov container entrypoint (PID 2, under tini): sshd and JupyterLab, stopped together.
#
# Inputs (all given at start, none baked into the image):
#   SSH_AUTHORIZED_KEYS       public key line(s) for $UMPROV_USER, or
#   SSH_AUTHORIZED_KEYS_FILE  a file holding them (default /etc/umprov/authorized_keys)
#   JUPYTER_TOKEN_FILE        a file holding the Jupyter token (default: /run/secrets/jupyter_token
#                             if present, else /etc/umprov/jupyter_token), or JUPYTER_TOKEN;
#                             Jupyter gets a copy only its user reads (/run/umprov/jupyter_token)
#   SSH_ALLOW_AGENT_FORWARDING  yes to let ssh -A forward an agent into the container (default no)
#   JUPYTER_IP, JUPYTER_PORT  where Jupyter listens inside the container (0.0.0.0:8888); the
#                             host side is decided by port publishing (umprov deploy --bind)
# The token is never printed; Jupyter itself shows a provided token as "...".
set -euo pipefail

log() { echo "umprov-entrypoint: $*" >&2; }
die() { log "error: $*"; exit 64; }

user=${UMPROV_USER:?UMPROV_USER is not set}
uid=$(id -u "$user") || die "user $user does not exist in the image"
gid=$(id -g "$user")
home=$(getent passwd "$user" | cut -d: -f6)

# --- SSH host keys: generated on first start, kept in the /etc/ssh/keys volume -------------
keys=/etc/ssh/keys
mkdir -p "$keys"
chmod 0700 "$keys"
if [ ! -s "$keys/ssh_host_ed25519_key" ]; then
    rm -f "$keys/ssh_host_ed25519_key" "$keys/ssh_host_ed25519_key.pub"
    ssh-keygen -q -t ed25519 -N '' -C "umprov-container" -f "$keys/ssh_host_ed25519_key"
    log "generated a new SSH host key"
fi
chmod 0600 "$keys/ssh_host_ed25519_key"
chmod 0644 "$keys/ssh_host_ed25519_key.pub"

# --- authorized keys for the one login user ------------------------------------------------
auth_file=/etc/ssh/authorized_keys/$user
mkdir -p /etc/ssh/authorized_keys
if [ -n "${SSH_AUTHORIZED_KEYS:-}" ]; then
    printf '%s\n' "$SSH_AUTHORIZED_KEYS" > "$auth_file.tmp"
elif [ -s "${SSH_AUTHORIZED_KEYS_FILE:-/etc/umprov/authorized_keys}" ]; then
    cat "${SSH_AUTHORIZED_KEYS_FILE:-/etc/umprov/authorized_keys}" > "$auth_file.tmp"
else
    die "no SSH key given: set SSH_AUTHORIZED_KEYS or mount SSH_AUTHORIZED_KEYS_FILE"
fi
grep -Eq '^(ssh-|ecdsa-|sk-)' "$auth_file.tmp" || die "SSH_AUTHORIZED_KEYS holds no public key"
chown root:root "$auth_file.tmp"
chmod 0644 "$auth_file.tmp"
mv -f "$auth_file.tmp" "$auth_file"
unset SSH_AUTHORIZED_KEYS

# --- Jupyter token: required; Jupyter reads it from a file only its user can read ----------
# Never through an environment: a process's environment stays readable in /proc/PID/environ
# for its whole life, and kernels and terminals would inherit it.
token_src=${JUPYTER_TOKEN_FILE:-}
if [ -z "$token_src" ]; then
    if [ -s /run/secrets/jupyter_token ]; then
        token_src=/run/secrets/jupyter_token
    else
        token_src=/etc/umprov/jupyter_token
    fi
fi
token_dir=/run/umprov
token_file=$token_dir/jupyter_token
mkdir -p "$token_dir"
chown "$uid:$gid" "$token_dir"
chmod 0700 "$token_dir"
(
    umask 077
    if [ -n "${JUPYTER_TOKEN:-}" ]; then
        printf '%s' "$JUPYTER_TOKEN" > "$token_file.tmp"  # printf is a builtin: no argv
    elif [ -s "$token_src" ]; then
        tr -d '\r\n' < "$token_src" > "$token_file.tmp"
    else
        : > "$token_file.tmp"
    fi
)
unset JUPYTER_TOKEN
length=$(wc -c < "$token_file.tmp")
[ "$length" -gt 0 ] || die "no Jupyter token given: set JUPYTER_TOKEN_FILE (or JUPYTER_TOKEN)"
[ "$length" -ge 16 ] || die "the Jupyter token is too short (16 characters at least)"
chown "$uid:$gid" "$token_file.tmp"
chmod 0600 "$token_file.tmp"
mv -f "$token_file.tmp" "$token_file"

# --- /workspace belongs to the user (a fresh volume may come up root-owned) -----------------
if [ "$(stat -c %u /workspace)" != "$uid" ]; then
    chown "$uid:$gid" /workspace
fi

# --- sshd: every login gets the container's environment ----------------------------------
# What docker exec and Jupyter get (the image's ENV, deploy's UMPROV_MANAGED_*, the user's
# --env / umprov_env), less this script's own inputs and what sshd sets for each session: one
# SetEnv line in a root-only file that sshd_config includes. Each value is quoted for sshd's
# parser (\ and " escaped), so spaces, quotes and $ arrive as given, whatever the login runs
# (a command, a shell, sftp); nothing on sshd's command line, where any process could read a
# secret. SetEnv cannot carry a line break: such a variable is left out, saying so (deploy
# refuses one). Login shells' /etc/profile resets PATH: profile.d puts the container's back.
write_login_environment() {
    local name value setenv=""
    while IFS= read -r name; do
        case "$name" in
            SSH_AUTHORIZED_KEYS*|SSH_ALLOW_AGENT_FORWARDING|SSH_PORT|JUPYTER_*) continue ;;
            HOME|USER|LOGNAME|SHELL|MAIL|PWD|OLDPWD|SHLVL|TERM|_) continue ;;
        esac
        value=${!name-}
        if [[ "$value" == *[$'\n\r']* ]]; then
            log "$name holds a line break: SSH logins do not get it"
            continue
        fi
        value=${value//\\/\\\\}
        value=${value//\"/\\\"}
        setenv+=" \"$name=$value\""
    done < <(compgen -e)
    (
        umask 077
        if [ -n "$setenv" ]; then printf 'SetEnv%s\n' "$setenv"; fi > /etc/ssh/umprov_environment.conf
    )
    mkdir -p /etc/profile.d
    printf "export PATH='%s'\n" "${PATH//\'/\'\\\'\'}" > /etc/profile.d/umprov-path.sh
}
write_login_environment
agent_forwarding=${SSH_ALLOW_AGENT_FORWARDING:-no}
case "$agent_forwarding" in
    yes|no) ;;
    *) die "SSH_ALLOW_AGENT_FORWARDING must be yes or no, not '$agent_forwarding'" ;;
esac
mkdir -p /run/sshd
chmod 0755 /run/sshd
/usr/sbin/sshd -t -o "AllowUsers=$user" || die "sshd configuration is invalid"
/usr/sbin/sshd -D -e -o "AllowUsers=$user" -o "Port=${SSH_PORT:-22}" \
    -o "AllowAgentForwarding=$agent_forwarding" &
sshd_pid=$!

# --- Jupyter as the user ---------------------------------------------------------------------
cd /workspace
env -u SSH_AUTHORIZED_KEYS_FILE HOME="$home" USER="$user" LOGNAME="$user" SHELL=/bin/bash \
    JUPYTER_TOKEN_FILE="$token_file" \
    setpriv --reuid="$uid" --regid="$gid" --init-groups \
    jupyter lab --config=/etc/jupyter/jupyter_server_config.py &
jupyter_pid=$!

stopping=0
stop_all() {
    stopping=1
    kill -TERM "$jupyter_pid" "$sshd_pid" 2>/dev/null || true
}
trap stop_all TERM INT HUP

# Whichever ends first (or a signal) stops the other; a crash exits non-zero so the restart
# policy brings the container back.
status=0
wait -n "$sshd_pid" "$jupyter_pid" || status=$?
if [ "$stopping" = 0 ]; then
    log "a service stopped (status $status); stopping the container"
fi
stop_all
wait "$jupyter_pid" 2>/dev/null || true
wait "$sshd_pid" 2>/dev/null || true
if [ "$stopping" = 1 ] && [ "$status" -ge 128 ]; then
    # stopped by a signal we forwarded: a clean stop
    log "stopped"
    exit 0
fi
exit "$status"

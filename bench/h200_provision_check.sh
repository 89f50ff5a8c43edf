#!/usr/bin/env bash
# Issue 3's real-GPU-host check, run on the H200 machine against localhost:
# the preflight play for real, then site.yml in check mode with --diff.
# Needs ansible-core carried as wheels in .whl/ (see bench/README.md, "Provision on a real GPU host").
set -uo pipefail
out=${OUT:-/tmp/umprov-h200}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site ANSIBLE_CONFIG=$PWD/ansible.cfg ANSIBLE_NOCOLOR=1
cat > /tmp/h200-inventory.yml <<'INV'
all:
  hosts:
    h200:
      ansible_connection: local
      ansible_python_interpreter: "{{ ansible_playbook_python }}"
      ansible_become: false
INV
{
  echo "== facts"; nvidia-smi --query-gpu=name,pci.device_id,driver_version --format=csv,noheader
  command -v lspci mokutil systemctl || true; ls /sys/firmware/efi 2>&1 | head -1
  echo "== preflight"
  python3 -m ansible playbook -i /tmp/h200-inventory.yml playbooks/preflight.yml -v
  echo "preflight rc=$?"
  echo "== site.yml --check --diff"
  python3 -m ansible playbook -i /tmp/h200-inventory.yml playbooks/site.yml --check --diff
  echo "site check rc=$?"
  echo "== driver.yml (real run: must leave the mounted driver alone, changed=0)"
  python3 -m ansible playbook -i /tmp/h200-inventory.yml playbooks/preflight.yml playbooks/driver.yml
  echo "driver rc=$?"
} 2>&1 | tee "$out/h200-provision.log"

#!/usr/bin/env bash
# What the libvirt backend needs on a fresh Debian 12 host to boot real VMs (qemu:///system): the daemon,
# QEMU, and libvirtd + virtlogd running. Idempotent; run as root. `make vm-test` and `make vm-bench` call it;
# `make test` does not (its libvirt tests use the daemonless test:///default driver).
#
# Both daemons start under `nice` (CODA_VM_NICE, default 10): libvirtd's children, the QEMU processes, inherit
# it, so a VM under software emulation does not starve the rest of the machine.
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "vm-setup: run as root (it installs packages and starts libvirtd)" >&2; exit 1; }
APT_PACKAGES=(libvirt-daemon-system libvirt-daemon-driver-qemu qemu-system-x86 qemu-utils)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "vm-setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The vm suite's stand-in for a remote libvirt host is a private sshd on 127.0.0.1 that the test starts and
# ends itself (tests/test_libvirt.py, loopback_ssh_uri): only the binary is wanted, so the package's own ssh
# service is kept from starting on port 22 while it installs (policy-rc.d), unless one was already there.
if ! dpkg-query -W -f='${Status}' openssh-server 2>/dev/null | grep -q "install ok installed"; then
  echo "vm-setup: installing openssh-server (its sshd binary, for the qemu+ssh:// test)"
  own_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && own_policy=1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-server >/dev/null || rc=$?
  [ -z "$own_policy" ] || rm -f /usr/sbin/policy-rc.d
  [ -z "${rc:-}" ] || exit "$rc"
fi

# Without udev (containers) /dev/kvm stays root:root 0600. libvirt probes QEMU's capabilities as root (KVM
# found), then checks that its QEMU user (libvirt-qemu, in group kvm) can open /dev/kvm, finds it cannot,
# declares the probe stale and probes again, forever: every domain define hangs. Give /dev/kvm the owner and
# mode Debian's udev rule gives it. Domains of type 'qemu' (TCG) still never use KVM.
if [ -c /dev/kvm ] && getent group kvm >/dev/null && [ "$(stat -c %G:%a /dev/kvm)" != "kvm:660" ]; then
  echo "vm-setup: /dev/kvm -> root:kvm 0660 (what udev would do)"
  chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
fi

NICE=${CODA_VM_NICE:-10}
pgrep -x virtlogd >/dev/null || { echo "vm-setup: starting virtlogd"; nice -n "$NICE" /usr/sbin/virtlogd -d; }
if ! pgrep -x libvirtd >/dev/null; then
  echo "vm-setup: starting libvirtd"
  nice -n "$NICE" /usr/sbin/libvirtd -d
fi
for _ in $(seq 100); do  # poll until the daemon answers (10 s at most)
  virsh -c qemu:///system version >/dev/null 2>&1 && { echo "vm-setup: libvirtd answers at qemu:///system"; exit 0; }
  sleep 0.1
done
echo "vm-setup: libvirtd does not answer at qemu:///system" >&2
exit 1

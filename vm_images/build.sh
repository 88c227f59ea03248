#!/usr/bin/env bash
# Build the libvirt backend's Debian 12 image: build/coda-debian12.qcow2 plus build/vmlinuz, build/initrd.img
# and build/domain.xml (a LibvirtConfig.domain_xml template that boots that kernel).
#
# The guest: an auto-login X session as root on :0 (Xorg on the virtio GPU, the domain XML's 1280x800
# <resolution> as its preferred mode), openbox, wmctrl (LibvirtDesktop.windows), qemu-guest-agent (started by
# udev when its virtio port appears), the apps (KAlgebra, GRASS GIS, TeXstudio: APPS below), the AT-SPI
# packages and python3-jeepney (the host reads app state by running coda_env/a11y.py in the guest). No
# network, no password login.
#
# Needs no loop device: debootstrap and apt install into a folder (with /proc and /sys mounted in it),
# `mkfs.ext4 -d` turns the folder into a partitionless filesystem, and the domain boots the
# kernel directly (root=/dev/vda), so no bootloader is installed. Run as root; heavy: run it with `nice`.
set -euo pipefail
# The apps that install from Debian (APPS to choose), and hooks for the ones that do not:
#   CHIMERAX_DEB=/path/ucsf-chimerax_1.8-1_amd64.deb   UCSF ChimeraX's .deb (Debian 12 build; the GUI is not
#                          in any registry), installed with its dependencies; `chimerax` is then on PATH
#   EXTRA_DEBS="/path/a.deb /path/b.deb"   other .deb files, installed with their dependencies
#   EXTRA_TREES="/path/celestia:/opt/celestia /path/elan:/opt/elan ..."   folders copied in (SRC:DEST)
#   HOOK=/path/script.sh   run in the image's chroot last (PATH links, licences, settings)
# Their paths may be relative to the caller's folder. They are checked before anything is built (a wrong
# path fails in a second, not after minutes of debootstrap); CHECK_ONLY=1 stops after that check.
die() { echo "vm-image: $*" >&2; exit 2; }
abspath() { case "$1" in /*) printf '%s' "$1" ;; *) printf '%s' "$PWD/$1" ;; esac; }
check_deb() {  # $1: the variable that named it, $2: the path
  [ -e "$2" ] || die "$1: $2 does not exist"
  [ -f "$2" ] || die "$1: $2 is not a file"
  case "$2" in *.deb) ;; *) die "$1: $2 is not a .deb (its name does not end in .deb)" ;; esac
  head -c 21 "$2" | cmp -s - <(printf '!<arch>\ndebian-binary') ||
    die "$1: $2 is not a Debian package (no .deb archive header)"
}
DEBS=()
for deb in ${EXTRA_DEBS:-}; do
  deb=$(abspath "$deb"); check_deb EXTRA_DEBS "$deb"; DEBS+=("$deb")
done
if [ -n "${CHIMERAX_DEB:-}" ]; then
  CHIMERAX_DEB=$(abspath "$CHIMERAX_DEB"); check_deb CHIMERAX_DEB "$CHIMERAX_DEB"
  if command -v dpkg-deb >/dev/null; then
    pkg=$(dpkg-deb --field "$CHIMERAX_DEB" Package 2>/dev/null) || die "CHIMERAX_DEB: dpkg-deb cannot read $CHIMERAX_DEB"
    case "$pkg" in
      ucsf-chimerax*) ;;
      *) die "CHIMERAX_DEB: $CHIMERAX_DEB is the package '$pkg', not UCSF ChimeraX (ucsf-chimerax)" ;;
    esac
  fi
  DEBS+=("$CHIMERAX_DEB")
fi
TREES=()
for tree in ${EXTRA_TREES:-}; do
  case "$tree" in *:/*) ;; *) die "EXTRA_TREES: '$tree' is not SRC:/ABSOLUTE/DEST" ;; esac
  src=$(abspath "${tree%%:*}")
  [ -d "$src" ] || die "EXTRA_TREES: $src is not a folder"
  TREES+=("$src:${tree#*:}")
done
if [ -n "${HOOK:-}" ]; then
  HOOK=$(abspath "$HOOK")
  [ -f "$HOOK" ] || die "HOOK: $HOOK is not a file"
fi
if [ -n "${CHECK_ONLY:-}" ]; then
  echo "vm-image: arguments checked; would install ${DEBS[*]:-no .deb}, copy ${TREES[*]:-no folder}, run ${HOOK:-no hook}"
  exit 0
fi

cd "$(dirname "$0")"
OUT=${OUT:-build}
SIZE=${SIZE:-8G}
SUITE=bookworm
IMAGE="$OUT/coda-debian12.qcow2"
# The apps' Debian packages, as each app package declares them (coda_env/apps/*/packages.txt); APPS overrides.
if [ -z "${APPS:-}" ]; then
  APPS=()
  for f in ../coda_env/apps/[!_]*/packages.txt; do
    while read -r pkg _; do
      case "$pkg" in ''|'#'*) ;; *) APPS+=("$pkg") ;; esac
    done < "$f"
  done
else
  APPS=($APPS)
fi
PACKAGES=(linux-image-amd64 initramfs-tools systemd-sysv udev dbus dbus-x11 qemu-guest-agent
          xserver-xorg-core xserver-xorg-input-libinput xinit x11-xserver-utils openbox wmctrl
          at-spi2-core python3 python3-jeepney fonts-dejavu-core procps psmisc coreutils "${APPS[@]}")

[ "$(id -u)" -eq 0 ] || { echo "vm-image: run as root (debootstrap needs it)" >&2; exit 1; }
for tool in debootstrap mkfs.ext4 qemu-img; do
  command -v "$tool" >/dev/null || missing_tools=1
done
if [ -n "${missing_tools:-}" ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap e2fsprogs qemu-utils >/dev/null
fi

mkdir -p "$OUT"
ROOT=$(mktemp -d "$OUT/rootfs.XXXXXX")
cleanup() {
  umount "$ROOT/proc" "$ROOT/sys" 2>/dev/null || true
  rm -rf --one-file-system "$ROOT" "$OUT/root.img"  # never crosses into a mount left behind
}
trap cleanup EXIT

# debootstrap resolves --include shallowly (it fails on KDE's dependency tree), so it makes only the base
# system; apt in the chroot installs the rest.
echo "vm-image: debootstrap $SUITE (minbase) into $ROOT"
debootstrap --variant=minbase "$SUITE" "$ROOT" ${MIRROR:+"$MIRROR"}
echo "vm-image: installing ${#PACKAGES[@]} packages and their dependencies"
mount -t proc proc "$ROOT/proc"
mount -t sysfs sysfs "$ROOT/sys"
printf '#!/bin/sh\nexit 101\n' > "$ROOT/usr/sbin/policy-rc.d"  # no services start in the chroot
chmod +x "$ROOT/usr/sbin/policy-rc.d"
chroot "$ROOT" apt-get update -qq
DEBIAN_FRONTEND=noninteractive chroot "$ROOT" apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}"
for deb in "${DEBS[@]}"; do
  echo "vm-image: installing $deb"
  cp "$deb" "$ROOT/tmp/$(basename "$deb")"
  DEBIAN_FRONTEND=noninteractive chroot "$ROOT" apt-get install -y -qq --no-install-recommends "/tmp/$(basename "$deb")"
  rm -f "$ROOT/tmp/$(basename "$deb")"
done
if [ -n "${CHIMERAX_DEB:-}" ]; then
  # The .deb puts ChimeraX under /usr/lib/ucsf-chimerax*/; its launcher, run as root, needs these folders.
  if ! chroot "$ROOT" env PATH=/usr/local/bin:/usr/bin:/bin sh -c 'command -v chimerax' >/dev/null; then
    bin=$(cd "$ROOT" && ls -d usr/lib/ucsf-chimerax*/bin/ChimeraX 2>/dev/null | head -n 1) || true
    [ -n "$bin" ] || die "CHIMERAX_DEB: $CHIMERAX_DEB installed, but no chimerax program is on PATH and no usr/lib/ucsf-chimerax*/bin/ChimeraX exists in the image"
    ln -sf "/$bin" "$ROOT/usr/local/bin/chimerax"
  fi
  mkdir -p "$ROOT/root/.config/ChimeraX" "$ROOT/root/.local/share/ChimeraX"
  echo "vm-image: ChimeraX installed: $(chroot "$ROOT" env PATH=/usr/local/bin:/usr/bin:/bin sh -c 'readlink -f "$(command -v chimerax)"')"
fi
for tree in "${TREES[@]}"; do
  echo "vm-image: copying ${tree%%:*} to ${tree#*:}"
  mkdir -p "$ROOT${tree#*:}"
  cp -a "${tree%%:*}/." "$ROOT${tree#*:}/"
done
if [ -n "${HOOK:-}" ]; then
  echo "vm-image: running $HOOK in the image"
  install -m 0755 "$HOOK" "$ROOT/tmp/coda-hook"
  chroot "$ROOT" /tmp/coda-hook
  rm -f "$ROOT/tmp/coda-hook"
fi
chroot "$ROOT" apt-get clean
rm -f "$ROOT/usr/sbin/policy-rc.d"
umount "$ROOT/proc" "$ROOT/sys"

echo "vm-image: configuring the guest"
echo coda-vm > "$ROOT/etc/hostname"
printf '/dev/vda / ext4 defaults,discard 0 1\n' > "$ROOT/etc/fstab"
install -m 0644 guest/coda-x.service "$ROOT/etc/systemd/system/coda-x.service"
install -D -m 0755 guest/xinitrc "$ROOT/etc/coda/xinitrc"
install -D -m 0644 guest/openbox-rc.xml "$ROOT/etc/coda/openbox-rc.xml"
mkdir -p "$ROOT/etc/systemd/system/multi-user.target.wants"
ln -sf /etc/systemd/system/coda-x.service "$ROOT/etc/systemd/system/multi-user.target.wants/coda-x.service"
ln -sf /lib/systemd/system/multi-user.target "$ROOT/etc/systemd/system/default.target"
# The snapshot reverts clocks and memory anyway; nothing to gain from these at boot.
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer; do
  ln -sf /dev/null "$ROOT/etc/systemd/system/$unit"
done
rm -rf "$ROOT/var/cache/apt/archives/"*.deb "$ROOT/var/lib/apt/lists/"*

cp "$(readlink -f "$ROOT/vmlinuz")" "$OUT/vmlinuz"
cp "$(readlink -f "$ROOT/initrd.img")" "$OUT/initrd.img"

echo "vm-image: making the filesystem ($SIZE) and $IMAGE"
mkfs.ext4 -q -F -L coda-root -d "$ROOT" "$OUT/root.img" "$SIZE"
qemu-img convert -f raw -O qcow2 "$OUT/root.img" "$IMAGE.tmp"
mv "$IMAGE.tmp" "$IMAGE"

OUT_ABS=$(cd "$OUT" && pwd)
sed -e "s|@KERNEL@|$OUT_ABS/vmlinuz|" -e "s|@INITRD@|$OUT_ABS/initrd.img|" domain.xml.in > "$OUT/domain.xml"
# What the build cost, for benchmarks/libvirt_latency.py to print beside the VM's figures.
printf '{"seconds": %d, "image_bytes": %d, "apps": "%s", "extra_debs": "%s", "built": "%s"}\n' "$SECONDS" \
  "$(stat -c %s "$IMAGE")" "${APPS[*]}" "${DEBS[*]}" "$(date -u +%FT%TZ)" > "$OUT/build-info.json"
echo "vm-image: done in ${SECONDS}s: $IMAGE ($(du -h "$IMAGE" | cut -f1)) (use backend_options={'base_image': '$OUT_ABS/coda-debian12.qcow2', 'domain_xml': '$OUT_ABS/domain.xml'})"

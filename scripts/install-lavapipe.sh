#!/usr/bin/env bash
# Mesa's lavapipe, for the wgpu backend's tests: a conforming Vulkan 1.3 device that runs on the
# CPU (Debian's mesa-vulkan-drivers, with the Vulkan loader libvulkan1), installed with apt when
# the loader or the driver is missing (as root, or through sudo). A second run does nothing.
# Prints the driver's ICD manifest.
set -euo pipefail

icd() {
  ls /usr/share/vulkan/icd.d/lvp_icd.*.json 2>/dev/null | head -1
}
if [[ -n "$(icd)" ]] && ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1'; then
  icd
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-lavapipe: no lavapipe and no apt-get to install it; install Mesa's Vulkan drivers" >&2
  exit 1
fi
sudo=""
if [[ "$(id -u)" != 0 ]]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-lavapipe: apt needs root (or sudo)" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-lavapipe: installing Debian's mesa-vulkan-drivers and libvulkan1" >&2
$sudo apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends mesa-vulkan-drivers libvulkan1 >&2
icd

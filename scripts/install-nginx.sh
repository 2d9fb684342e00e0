#!/usr/bin/env bash
# NGINX, for the replicas test (tests/replicas.rs), which puts a real load balancer in front of
# three `minfer serve` replicas: Debian's package, installed with apt when it is missing (as root,
# or through sudo). A second run does nothing. Prints the path of the binary.
#
# The test runs NGINX as the current user with a configuration of its own in a temporary
# directory; the package's service is neither started nor needed.
#
# $MINFER_NGINX, when set, names an nginx to use instead; nothing is installed then.
set -euo pipefail

if [[ -n "${MINFER_NGINX:-}" ]]; then
  command -v "$MINFER_NGINX"
  exit 0
fi
for nginx in nginx /usr/sbin/nginx; do
  if command -v "$nginx" >/dev/null 2>&1; then
    command -v "$nginx"
    exit 0
  fi
done
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-nginx: no nginx on the PATH or at /usr/sbin/nginx and no apt-get to install it;" \
       "install NGINX, or set MINFER_NGINX" >&2
  exit 1
fi
sudo=""
if [[ "$(id -u)" != 0 ]]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-nginx: apt needs root (or sudo)" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-nginx: installing Debian's nginx package" >&2
$sudo apt-get update -qq >&2
# Where an init system runs, the package starts its own service on port 80; the test does not
# use it and does not mind it.
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends nginx >&2
if command -v nginx >/dev/null 2>&1; then command -v nginx; else echo /usr/sbin/nginx; fi

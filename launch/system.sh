#!/usr/bin/env bash
# The install's system step: a Vulkan device for ManiSkill (SAPIEN needs one even for state
# observations). On a CPU machine that is Mesa's lavapipe, at least Mesa 25: Debian bookworm's
# own Mesa 22 is too old, its bookworm-backports suite has 25.
#
# Idempotent and cheap when done (one dpkg query). It needs root and apt; where it cannot run it
# says why and exits 0, so the install goes on and the ManiSkill tests skip with that reason.
set -u

MIN_MESA=25
SOURCES=/etc/apt/sources.list.d/bookworm-backports.sources

mesa_version() { dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true; }
mesa_ok() {
    local v; v=$(mesa_version)
    [ -n "$v" ] && dpkg --compare-versions "$v" ge "$MIN_MESA"
}
skip() { echo "system: $* (the ManiSkill envs will need a Vulkan driver)"; exit 0; }

if mesa_ok; then exit 0; fi
command -v apt-get >/dev/null 2>&1 || skip "no apt-get here; install Mesa >= $MIN_MESA's Vulkan drivers yourself"
[ "$(id -u)" = 0 ] || skip "not root; run 'sudo make system' once"

codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
suite=()
if [ "$codename" = bookworm ]; then
    if [ ! -f "$SOURCES" ]; then
        printf '%s\n' "Types: deb" "URIs: http://deb.debian.org/debian" \
            "Suites: bookworm-backports" "Components: main" \
            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" > "$SOURCES"
    fi
    suite=(-t bookworm-backports)
fi
echo "system: installing Mesa's Vulkan drivers (lavapipe) from ${codename:-the default suite}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null || skip "apt-get update failed"
apt-get install -y -q "${suite[@]}" mesa-vulkan-drivers libvulkan1 >/dev/null \
    || skip "apt-get install mesa-vulkan-drivers failed"
mesa_ok || skip "Mesa's Vulkan drivers are $(mesa_version), older than $MIN_MESA"
echo "system: mesa-vulkan-drivers $(mesa_version)"

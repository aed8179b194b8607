#!/usr/bin/env bash
# The install's system step, three things:
# - a Vulkan device for ManiSkill (SAPIEN needs one even for state observations). On a CPU machine
#   that is Mesa's lavapipe, at least Mesa 25: Debian bookworm's own Mesa 22 is too old, its
#   bookworm-backports suite has 25.
# - Mesa's EGL and OpenGL (libegl1, libgl1-mesa-dri), on which MiniWorld (the Navigation env)
#   renders headless on a CPU.
# - chromium-headless-shell, the headless browser in which a test opens the evaluation's episode
#   pages (launch/run/pages.py) and checks that every image shows.
#
# Idempotent and cheap when done (a dpkg query each). It needs root and apt; where it cannot run
# it says why and exits 0, so the install goes on and the tests that need these skip with that reason.
set -u

MIN_MESA=25
SOURCES=/etc/apt/sources.list.d/bookworm-backports.sources
BROWSER=chromium-headless-shell

mesa_version() { dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true; }
mesa_ok() {
    local v; v=$(mesa_version)
    [ -n "$v" ] && dpkg --compare-versions "$v" ge "$MIN_MESA"
}
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }
browser_ok() { installed "$BROWSER"; }
GL=(libegl1 libgl1-mesa-dri)
gl_ok() { for p in "${GL[@]}"; do installed "$p" || return 1; done; }

if mesa_ok && browser_ok && gl_ok; then exit 0; fi
skip() { echo "system: $* (the ManiSkill envs need a Vulkan driver, a test needs $BROWSER)"; exit 0; }
command -v apt-get >/dev/null 2>&1 \
    || skip "no apt-get here; install Mesa >= $MIN_MESA's Vulkan drivers and $BROWSER yourself"
[ "$(id -u)" = 0 ] || skip "not root; run 'sudo make system' once"

export DEBIAN_FRONTEND=noninteractive
codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
suite=()
if ! mesa_ok && [ "$codename" = bookworm ]; then
    if [ ! -f "$SOURCES" ]; then
        printf '%s\n' "Types: deb" "URIs: http://deb.debian.org/debian" \
            "Suites: bookworm-backports" "Components: main" \
            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" > "$SOURCES"
    fi
    suite=(-t bookworm-backports)
fi
apt-get update -q >/dev/null || skip "apt-get update failed"

if ! gl_ok; then
    echo "system: installing ${GL[*]}"
    apt-get install -y -q "${GL[@]}" >/dev/null \
        || echo "system: apt-get install ${GL[*]} failed (the Navigation env will not render)"
fi

if ! browser_ok; then
    echo "system: installing $BROWSER"
    if apt-get install -y -q "$BROWSER" >/dev/null; then
        echo "system: $BROWSER $(dpkg-query -W -f='${Version}' "$BROWSER")"
    else
        echo "system: apt-get install $BROWSER failed (the episode-page test will skip)"
    fi
fi

if ! mesa_ok; then
    echo "system: installing Mesa's Vulkan drivers (lavapipe) from ${codename:-the default suite}"
    apt-get install -y -q "${suite[@]}" mesa-vulkan-drivers libvulkan1 >/dev/null \
        || skip "apt-get install mesa-vulkan-drivers failed"
    mesa_ok || skip "Mesa's Vulkan drivers are $(mesa_version), older than $MIN_MESA"
    echo "system: mesa-vulkan-drivers $(mesa_version)"
fi

#!/bin/sh
# Make the image's Python base from Debian's own archive, for a builder that cannot pull
# from an image registry: debootstrap a minimal Debian with its Python 3.11 and import the
# tree as an image. Run as root (debootstrap needs it); it takes about a minute.
#
#   deploy/debian-base.sh [IMAGE] [MIRROR]
#   podman build --build-arg BASE=IMAGE -t evagg:0.1.0 .
set -eu

image=${1:-localhost/evagg-debian-base:bookworm}
mirror=${2:-http://deb.debian.org/debian}
suite=bookworm   # Python 3.11, the version the default base image has

for tool in debootstrap podman; do
    if ! command -v "$tool" >/dev/null; then
        echo "debian-base.sh: $tool is not installed; install it (apt-get install $tool) and run again" >&2
        exit 1
    fi
done
if [ "$(id -u)" != 0 ]; then
    echo "debian-base.sh: debootstrap needs root; run it with sudo" >&2
    exit 1
fi

root=$(mktemp -d "${TMPDIR:-/var/tmp}/evagg-base.XXXXXX")
trap 'rm -rf -- "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$suite" "$root" "$mirror" >"$root.log" 2>&1 || {
    echo "debian-base.sh: debootstrap of $suite from $mirror failed; its log:" >&2
    cat "$root.log" >&2
    rm -f -- "$root.log"
    exit 1
}
rm -f -- "$root.log"
# What only the bootstrap needed: downloaded packages and package lists.
rm -rf -- "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar --numeric-owner -C "$root" -c . | podman import --quiet \
    --change 'CMD ["/bin/sh"]' --change 'ENV LANG=C.UTF-8' - "$image" >/dev/null
echo "$image"

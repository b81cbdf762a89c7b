#!/usr/bin/env bash
# The images the container-node tests run, as OCI archives under build/images
# (`make test-images`; docs/development.md "Test images"), each tagged inside its archive:
#   loader.tar    kmm.sandbox/loader:1     busybox, a recording modprobe, a firmware file
#   workload.tar  kmm.sandbox/workload:1   busybox and an entrypoint printing what it was given
#   pause.tar     kmm.sandbox/pause:3.10   the pinned Kubernetes module's pause, built static
#   kbuild.tar    kmm.sandbox/kbuild:1     Debian trixie, gcc, make, libc6-dev and the headers
#                                          of one kernel: the base of test Dockerfiles that build
#                                          a module (tests/buildsign), fully offline
# and kbuild.kernel, that kernel's string (uname -r form, e.g. 6.12.57+deb13-amd64),
# read from the image's /usr/src/linux-headers-*-amd64: Debian's point
# releases change it, so no test hard-codes it.
# Their files come from Debian's busybox and its libc (mmdebstrap, cached by
# its recipe like build_image.sh's base), scripts/test_images/<name>/ (copied over
# it) and build/pause/linux/pause.c of the pinned Kubernetes module (gcc
# -static). buildah (vfs, its own storage directory) makes each a one-layer
# image from scratch. Reproducible: every file, the layer and the config carry
# one fixed time, so the same files make the same image digest.
# Cached by content: the key of an archive is the digest of its layer as
# tarred here plus its config, so an archive is built again only when what
# goes into it changes; the cache keeps one per key.
# kbuild's root filesystem is cached by its recipe like busybox; its headers
# are the kernel trixie's linux-headers-amd64 names when it is first made
# (scripts/debian_kbuild.sh). Delete ~/.cache/kmm/image/kbuild-* for newer ones.
# Needs root (mmdebstrap's first run), mmdebstrap, buildah, gcc with a static
# libc, and go (the module cache, filled by `make sandbox-binaries` or here).
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=scripts/inherited_fds.sh
source scripts/inherited_fds.sh
umask 022
OUT=${OUT:-build/images}
CACHE=${KMM_CACHE_DIR:-$HOME/.cache/kmm}/image
FILES=scripts/test_images
# Not the commit's time: these images depend on no commit of kmm.
EPOCH=1735689600
export SOURCE_DATE_EPOCH=$EPOCH

mkdir -p "$CACHE/test-images" "$OUT"
WORK=$(mktemp -d /tmp/kmm-test-images.XXXXXX)
BUILDAH=(buildah --root "$WORK/storage" --runroot "$WORK/run" --storage-driver vfs)
cleanup() {
    "${BUILDAH[@]}" rm --all >/dev/null 2>&1 || true
    "${BUILDAH[@]}" rmi --all --force >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# 1. busybox, from Debian's packages: the key is everything it is made from.
# The dynamic busybox and its libc, not busybox-static: that one's shell runs
# its own applets before anything on PATH, so the hooks' `sh -c "modprobe ..."`
# would run busybox's modprobe, not the image's.
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
MMDEBSTRAP=(
    mmdebstrap --variant=extract --include=busybox
    --aptopt='Acquire::Languages "none"'
    "$SUITE"
)
SOURCES=(
    "deb $MIRROR $SUITE main"
    "deb $MIRROR $SUITE-updates main"
    "deb $MIRROR-security $SUITE-security main"
)
KEY=$(printf '%s\n' "${MMDEBSTRAP[@]}" "${SOURCES[@]}" | sha256sum | cut -c1-12)
BUSYBOX=$CACHE/busybox-$SUITE-$KEY.tar
if [ ! -f "$BUSYBOX" ]; then
    echo "test-images: fetching busybox with mmdebstrap ($SUITE)"
    without_inherited_fds "${MMDEBSTRAP[@]}" "$WORK/busybox.tar" "${SOURCES[@]}"
    mv "$WORK/busybox.tar" "$BUSYBOX"
fi

# kbuild: a Debian trixie root filesystem that compiles out-of-tree modules.
KBUILD_SUITE=trixie
KBUILD_HOOK=scripts/debian_kbuild.sh
KBUILD_MMDEBSTRAP=(
    mmdebstrap --variant=minbase --include=gcc,make,libc6-dev
    --aptopt='Acquire::Languages "none"'
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --customize-hook="$KBUILD_HOOK \"\$1\" headers"
    "$KBUILD_SUITE"
)
KBUILD_SOURCES=(
    "deb $MIRROR $KBUILD_SUITE main"
    "deb $MIRROR $KBUILD_SUITE-updates main"
    "deb $MIRROR-security $KBUILD_SUITE-security main"
)
KEY=$(cat "$KBUILD_HOOK" <(printf '%s\n' "${KBUILD_MMDEBSTRAP[@]}" "${KBUILD_SOURCES[@]}" "$EPOCH") |
    sha256sum | cut -c1-12)
KBUILD=$CACHE/kbuild-$KBUILD_SUITE-$KEY.tar
if [ ! -f "$KBUILD" ]; then
    echo "test-images: building kbuild's root filesystem with mmdebstrap ($KBUILD_SUITE)"
    without_inherited_fds "${KBUILD_MMDEBSTRAP[@]}" "$WORK/kbuild-rootfs.tar" "${KBUILD_SOURCES[@]}"
    mv "$WORK/kbuild-rootfs.tar" "$KBUILD"
    find "$CACHE" -maxdepth 1 -name "kbuild-$KBUILD_SUITE-*.tar" ! -name "$(basename "$KBUILD")" -delete
fi

# 2. pause, from the Kubernetes module the sandbox pins (go.mod names its
# version): the newest wrapper, the default release's (kubereleases.DEFAULT;
# tests/unit/sandbox/test_kubereleases.py checks that they agree).
WRAPPER=$(ls -d src/kmm/sandbox/gotools/kubernetes/v1.* | sort -V | tail -n 1)
KUBERNETES=$(cd "$WRAPPER" && go mod download -json k8s.io/kubernetes |
    sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
PAUSE_C=$KUBERNETES/build/pause/linux/pause.c
PAUSE_TAG=$(sed -n 's/^TAG ?= //p' "$KUBERNETES/build/pause/Makefile")

# A root filesystem with busybox in /bin, the libraries it needs, and every
# applet a link to it but modprobe, which an image brings itself when it has one.
LIBDIR=lib/x86_64-linux-gnu
busybox_root() {
    mkdir -p "$1/bin" "$1/sbin" "$1/usr/bin" "$1/usr/sbin" "$1/etc" "$1/dev" "$1/proc" "$1/sys" \
        "$1/tmp"
    tar -xf "$BUSYBOX" -C "$1" ./bin/busybox ./lib64/ld-linux-x86-64.so.2 "./$LIBDIR/ld-linux-x86-64.so.2"
    local library applet
    for library in $(readelf -d "$1/bin/busybox" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p'); do
        tar -xf "$BUSYBOX" -C "$1" "./$LIBDIR/$library"
    done
    # Run with the image's own loader and libraries, whatever this machine has.
    for applet in $("$1/$LIBDIR/ld-linux-x86-64.so.2" --library-path "$1/$LIBDIR" \
        "$1/bin/busybox" --list); do
        [ "$applet" = busybox ] || [ "$applet" = modprobe ] || ln -s busybox "$1/bin/$applet"
    done
}

stage_loader() {
    busybox_root "$1"
    mkdir -p "$1/etc/modprobe.d" "$1/var/log"
    cp -R "$FILES/loader/." "$1/"
    ln -s ../usr/sbin/modprobe "$1/sbin/modprobe"
    ln -s ../usr/sbin/modprobe "$1/bin/modprobe"
}

stage_workload() {
    busybox_root "$1"
    cp -R "$FILES/workload/." "$1/"
}

# A whole Debian system: its owners and modes are Debian's, kept as they are.
stage_kbuild() {
    tar -xf "$KBUILD" -C "$1"
}

stage_pause() {
    gcc -Os -Wall -Werror -static "-DVERSION=v$PAUSE_TAG-kmm" -o "$1/pause" "$PAUSE_C"
    strip "$1/pause"
}

PATH_ENV=PATH=/usr/sbin:/usr/bin:/sbin:/bin
declare -A REF CONFIG
REF[loader]=kmm.sandbox/loader:1
CONFIG[loader]="--env $PATH_ENV --cmd [\"sleep\",\"infinity\"]"
REF[workload]=kmm.sandbox/workload:1
CONFIG[workload]="--env $PATH_ENV --user 65532:65532 --entrypoint [\"/entrypoint\"] --cmd []"
# As upstream's pause image: a user of its own, no root.
REF[pause]=kmm.sandbox/pause:3.10
CONFIG[pause]="--user 65535:65535 --entrypoint [\"/pause\"] --cmd []"
REF[kbuild]=kmm.sandbox/kbuild:1
CONFIG[kbuild]="--env $PATH_ENV --cmd [\"bash\"]"

BUILDAH_VERSION=$(buildah --version)
# The layer as buildah will see it: owners, modes and times fixed, so its
# digest is a function of the files' content alone.
layer() {
    local name=$1 root=$WORK/$1
    mkdir "$root"
    "stage_$name" "$root"
    local owners=(--numeric-owner)
    if [ "$name" != kbuild ]; then
        # Modes as a umask of 022 makes them, whatever the checkout's were.
        chmod -R go-w "$root"
        [ ! -d "$root/tmp" ] || chmod 1777 "$root/tmp"
        owners+=(--owner=0 --group=0)
    fi
    tar --create --file "$WORK/$name.tar" --directory "$root" --sort=name \
        "${owners[@]}" --mtime="@$EPOCH" .
}
for name in loader workload pause kbuild; do
    if [ "$name" = kbuild ]; then
        # Its layer is a function of the cached root filesystem alone: keyed
        # by that file, and tarred (20 seconds) only when it is built.
        key=$(cat "$KBUILD" <(printf '%s\n' "${REF[$name]}" "${CONFIG[$name]}" "$BUILDAH_VERSION") |
            sha256sum | cut -c1-16)
        [ -f "$CACHE/test-images/$name-$key.tar" ] || layer "$name"
    else
        layer "$name"
        key=$(cat "$WORK/$name.tar" <(printf '%s\n' "${REF[$name]}" "${CONFIG[$name]}" "$BUILDAH_VERSION") |
            sha256sum | cut -c1-16)
    fi
    cached=$CACHE/test-images/$name-$key.tar
    if [ ! -f "$cached" ]; then
        echo "test-images: building $name (${REF[$name]})"
        container=$("${BUILDAH[@]}" from --quiet scratch)
        "${BUILDAH[@]}" add --quiet "$container" "$WORK/$name.tar" / >/dev/null
        # shellcheck disable=SC2086 # CONFIG holds words, none with spaces
        "${BUILDAH[@]}" config ${CONFIG[$name]} \
            --label "org.opencontainers.image.title=kmm test image $name" "$container"
        "${BUILDAH[@]}" commit --quiet --timestamp "$EPOCH" --format oci --rm \
            "$container" "oci-archive:$WORK/$name.oci.tar:${REF[$name]}" >/dev/null
        mv "$WORK/$name.oci.tar" "$cached"
        # One archive per image in the cache: the others are older builds.
        find "$CACHE/test-images" -name "$name-*.tar" ! -name "$name-$key.tar" -delete
    fi
    if ! cmp -s "$cached" "$OUT/$name.tar"; then
        cp "$cached" "$OUT/$name.tar.partial"
        mv "$OUT/$name.tar.partial" "$OUT/$name.tar"
    fi
    echo "test-images: $OUT/$name.tar (${REF[$name]}, key $key)"
done
# The kernel kbuild's headers are for, as a node reports it (uname -r).
headers=$(tar --list --file "$KBUILD" ./usr/src/ | sed -n 's|^\./usr/src/linux-headers-\([^/]*-amd64\)/$|\1|p')
[ "$(printf '%s\n' "$headers" | wc -l)" = 1 ] && [ -n "$headers" ] ||
    { echo "test-images: expected the headers of one kernel in kbuild, found: $headers" >&2; exit 1; }
printf '%s\n' "$headers" >"$OUT/kbuild.kernel.partial"
mv "$OUT/kbuild.kernel.partial" "$OUT/kbuild.kernel"
echo "test-images: $OUT/kbuild.kernel ($headers)"

#!/usr/bin/env bash
# kmm's builder image as an OCI archive, build/kmm-builder-image.tar (`make
# image`; docs/build-and-sign.md "The builder image"): what build and sign pods run
# (kmm.operator.build.pods), tagged inside the archive with
# kmm.operator.build.settings.DEFAULT_BUILDER_IMAGE, the operator's
# --builder-image default.
#   - Debian trixie (buildah 1.39 reads Dockerfile heredocs; bookworm's 1.28
#     does not), made by mmdebstrap: buildah, netavark (buildah 1.39 will not
#     start without it), kmod, openssl, ca-certificates and the kernel's
#     sign-file (linux-kbuild-<abi> of the kernel trixie's linux-headers-amd64
#     names, linked as /usr/local/bin/sign-file: scripts/debian_kbuild.sh);
#   - /etc/containers from scripts/builder_image: no unqualified search
#     registries, overlay storage under /var/lib/containers.
# One layer from scratch, built with the host's buildah (vfs, its own
# storage directory). Cached by content, as build_test_images.sh: the key of
# the archive is the digest of its layer as tarred here, its reference and
# config; the root filesystem is cached by its recipe (mmdebstrap's options,
# the hook, the sources, the time), so a new commit of kmm rebuilds nothing.
# Delete ~/.cache/kmm/image/builder-* to take Debian's updates.
# Reproducible: SOURCE_DATE_EPOCH fixed; every file, the layer and the config
# carry that time. Needs root, mmdebstrap and buildah (`make image-tools`).
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=scripts/inherited_fds.sh
source scripts/inherited_fds.sh
umask 022
OUT=${OUT:-build/kmm-builder-image.tar}
IMAGE=${IMAGE:-$(.venv/bin/python -c 'from kmm.operator.build import settings; print(settings.DEFAULT_BUILDER_IMAGE)')}
CACHE=${KMM_CACHE_DIR:-$HOME/.cache/kmm}/image
FILES=scripts/builder_image
HOOK=scripts/debian_kbuild.sh
SUITE=trixie
MIRROR=http://deb.debian.org/debian
PACKAGES=buildah,netavark,kmod,openssl,ca-certificates
EPOCH=1735689600
export SOURCE_DATE_EPOCH=$EPOCH

mkdir -p "$CACHE" "$(dirname "$OUT")"
MMDEBSTRAP=(
    mmdebstrap --variant=minbase --include="$PACKAGES"
    --aptopt='Acquire::Languages "none"'
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    # Left out (150 of 280 MiB): the CNI plugins containers-common pulls in
    # (RUN steps use the pod's network under chroot isolation) and buildah's
    # test helpers.
    --dpkgopt='path-exclude=/usr/lib/cni/*'
    --dpkgopt='path-exclude=/usr/libexec/buildah/copy'
    --dpkgopt='path-exclude=/usr/libexec/buildah/imgtype'
    --dpkgopt='path-exclude=/usr/libexec/buildah/testreport'
    --dpkgopt='path-exclude=/usr/libexec/buildah/serve'
    --customize-hook="$HOOK \"\$1\" kbuild"
    "$SUITE"
)
SOURCES=(
    "deb $MIRROR $SUITE main"
    "deb $MIRROR $SUITE-updates main"
    "deb $MIRROR-security $SUITE-security main"
)
KEY=$(cat "$HOOK" <(printf '%s\n' "${MMDEBSTRAP[@]}" "${SOURCES[@]}" "$EPOCH") | sha256sum | cut -c1-12)
ROOTFS=$CACHE/builder-$SUITE-$KEY.tar

WORK=$(mktemp -d /tmp/kmm-builder-image.XXXXXX)
BUILDAH=(buildah --root "$WORK/storage" --runroot "$WORK/run" --storage-driver vfs)
cleanup() {
    "${BUILDAH[@]}" rm --all >/dev/null 2>&1 || true
    "${BUILDAH[@]}" rmi --all --force >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

if [ ! -f "$ROOTFS" ]; then
    echo "builder-image: building the root filesystem with mmdebstrap ($SUITE: $PACKAGES, sign-file)"
    without_inherited_fds "${MMDEBSTRAP[@]}" "$WORK/rootfs.tar" "${SOURCES[@]}"
    mv "$WORK/rootfs.tar" "$ROOTFS"
    find "$CACHE" -maxdepth 1 -name "builder-$SUITE-*.tar" ! -name "$(basename "$ROOTFS")" -delete
else
    echo "builder-image: root filesystem from the cache ($ROOTFS)"
fi

# The layer as buildah will see it: the root filesystem with the files of
# scripts/builder_image over it, owners, modes and times fixed.
mkdir "$WORK/root"
tar -xf "$ROOTFS" -C "$WORK/root"
cp -R "$FILES/." "$WORK/root/"
chmod -R go-w "$WORK/root/etc/containers"
tar --create --file "$WORK/layer.tar" --directory "$WORK/root" --sort=name \
    --numeric-owner --mtime="@$EPOCH" --clamp-mtime .
CONFIG=(
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    --env BUILDAH_ISOLATION=chroot
    --workingdir /
    --cmd '["buildah","--help"]'
)
key=$(cat "$WORK/layer.tar" <(printf '%s\n' "$IMAGE" "${CONFIG[@]}" "$(buildah --version)") |
    sha256sum | cut -c1-16)
if [ -f "$OUT" ] && [ "$(cat "$OUT.key" 2>/dev/null)" = "$key" ]; then
    echo "builder-image: $OUT ($IMAGE) is up to date (key $key)"
    exit 0
fi
rm -f "$OUT.key" "$OUT.partial"
echo "builder-image: building $OUT ($IMAGE)"
container=$("${BUILDAH[@]}" from --quiet scratch)
"${BUILDAH[@]}" add --quiet "$container" "$WORK/layer.tar" / >/dev/null
"${BUILDAH[@]}" config "${CONFIG[@]}" \
    --label org.opencontainers.image.title="kmm builder" "$container"
"${BUILDAH[@]}" commit --quiet --timestamp "$EPOCH" --format oci --rm \
    "$container" "oci-archive:$OUT.partial:$IMAGE" >/dev/null
mv "$OUT.partial" "$OUT"
echo "$key" >"$OUT.key"
echo "builder-image: $OUT ($IMAGE, key $key, $(du -m "$OUT" | cut -f1) MiB)"

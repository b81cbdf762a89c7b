#!/usr/bin/env bash
# kmm's container image as an OCI archive, without a container engine or a
# registry (`make image`; docs/install.md "The image"):
#   1. a Debian root filesystem with Python, made by mmdebstrap from Debian's
#      packages; cached by its recipe, since it depends on nothing of kmm;
#   2. buildah (vfs storage, chroot isolation, its own storage directory)
#      adds it as the first layer, then a second one: a venv in /opt/kmm with
#      kmm's wheel, built from this checkout, and its dependencies at the
#      versions .venv has (the versions the tests ran), and the user kmm
#      (65532, as deploy/operator/deployment.yaml runs it);
#   3. `buildah commit` writes the archive, tagged with IMAGE.
# Built once per commit: the image records the digest of what it is built
# from (label kmm.image.inputs, scripts/image_inputs.py), and OUT.key the
# key of the whole build (those inputs, IMAGE, the revision and time, the
# base); the same key again finds OUT made and stops there. The image test
# compares that label with the work tree's inputs, so it never checks a
# stale archive.
# Reproducible: SOURCE_DATE_EPOCH is the commit's time; mmdebstrap makes the
# same tarball from the same package versions, pip byte-compiles with hashes
# instead of timestamps under it, and --timestamp gives every file of the
# second layer and the image config that time (the base layer has a fixed
# time of its own). What still moves: a new Debian package version or
# a dependency version range resolved anew (docs/install.md "The image").
# Needs root, mmdebstrap and buildah (`make image-tools` installs them).
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=scripts/inherited_fds.sh
source scripts/inherited_fds.sh
OUT=${OUT:-build/kmm-image.tar}
IMAGE=${IMAGE:-$(.venv/bin/python -c 'from kmm.api import installation; print(installation.IMAGE)')}
CACHE=${KMM_CACHE_DIR:-$HOME/.cache/kmm}/image
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
PACKAGES=python3,python3-venv,ca-certificates
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
# The wheel is built from the work tree: say so when it is not the commit's.
REVISION=$(git rev-parse HEAD)$(git diff --quiet HEAD -- src pyproject.toml README.md || echo -dirty)
INPUTS=$(.venv/bin/python scripts/image_inputs.py)

mkdir -p "$CACHE" "$(dirname "$OUT")"
# 1. The base root filesystem: the key is everything it is made from.
# Docs, man pages and translations are left out (the image runs no humans).
MMDEBSTRAP=(
    mmdebstrap --variant=minbase --include="$PACKAGES"
    --aptopt='Acquire::Languages "none"'
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    "$SUITE"
)
SOURCES=(
    "deb $MIRROR $SUITE main"
    "deb $MIRROR $SUITE-updates main"
    "deb $MIRROR-security $SUITE-security main"
)
# Its own fixed time, not the commit's, so a new commit reuses it (and its
# layer, below). Delete the cache entry to take Debian's updates.
BASE_EPOCH=1735689600
KEY=$(printf '%s\n' "${MMDEBSTRAP[@]}" "${SOURCES[@]}" "$BASE_EPOCH" | sha256sum | cut -c1-12)
BASE=$CACHE/base-$SUITE-$KEY.tar

BUILD_KEY=$(printf '%s\n' "$INPUTS" "$IMAGE" "$REVISION" "$SOURCE_DATE_EPOCH" "$KEY" | sha256sum | cut -c1-16)
if [ -f "$OUT" ] && [ "$(cat "$OUT.key" 2>/dev/null)" = "$BUILD_KEY" ]; then
    echo "image: $OUT ($IMAGE) is up to date (key $BUILD_KEY)"
    exit 0
fi
rm -f "$OUT.key"

WORK=$(mktemp -d /tmp/kmm-image.XXXXXX)
BUILDAH=(buildah --root "$WORK/storage" --runroot "$WORK/run" --storage-driver vfs)
cleanup() {
    "${BUILDAH[@]}" rm --all >/dev/null 2>&1 || true
    # vfs layers are plain directories; buildah's own removal is the clean way.
    "${BUILDAH[@]}" rmi --all --force >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

if [ ! -f "$BASE" ]; then
    echo "image: building the base root filesystem with mmdebstrap ($SUITE: $PACKAGES)"
    SOURCE_DATE_EPOCH=$BASE_EPOCH without_inherited_fds "${MMDEBSTRAP[@]}" "$WORK/base.tar" "${SOURCES[@]}"
    mv "$WORK/base.tar" "$BASE"
else
    echo "image: base root filesystem from the cache ($BASE)"
fi

# 2. The layers. Every wheel is fetched here, with this machine's pip and
# its trust settings, and installed in the image without a network: the
# image's pip sees only this set.
.venv/bin/pip wheel --quiet --no-deps --wheel-dir "$WORK/wheels" .
.venv/bin/pip freeze --exclude-editable >"$WORK/constraints.txt"
WHEEL=$(basename "$(ls "$WORK"/wheels/kmm-*.whl)")
.venv/bin/pip download --quiet --only-binary :all: --dest "$WORK/wheels" \
    --constraint "$WORK/constraints.txt" "$WORK/wheels/$WHEEL"

base=$("${BUILDAH[@]}" from --quiet scratch)
"${BUILDAH[@]}" add --quiet "$base" "$BASE" / >/dev/null
# The base layer keeps the base's own time: the same layer for every commit,
# which a registry then stores and a node pulls once.
"${BUILDAH[@]}" commit --quiet --timestamp "$BASE_EPOCH" --rm "$base" kmm-base >/dev/null

app=$("${BUILDAH[@]}" from --quiet kmm-base)
RUN=("${BUILDAH[@]}" run --isolation chroot --env "SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH" "$app" --)
"${BUILDAH[@]}" copy --quiet "$app" "$WORK/wheels" /tmp/wheels >/dev/null
"${RUN[@]}" python3 -m venv /opt/kmm
"${RUN[@]}" /opt/kmm/bin/pip install --quiet --no-cache-dir --disable-pip-version-check \
    --no-index --find-links /tmp/wheels "/tmp/wheels/$WHEEL"
"${RUN[@]}" sh -c 'rm -rf /tmp/* &&
    echo "kmm:x:65532:65532:kmm:/nonexistent:/usr/sbin/nologin" >>/etc/passwd &&
    echo "kmm:x:65532:" >>/etc/group'
"${BUILDAH[@]}" config \
    --user 65532:65532 \
    --workingdir / \
    --env PATH=/opt/kmm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --entrypoint '["kmm"]' --cmd '["--help"]' \
    --label org.opencontainers.image.title=kmm \
    --label "org.opencontainers.image.revision=$REVISION" \
    --label "kmm.image.inputs=$INPUTS" \
    "$app"

# 3. The archive, written beside and renamed, so a failed build leaves no half file.
rm -f "$OUT.partial"
"${BUILDAH[@]}" commit --quiet --timestamp "$SOURCE_DATE_EPOCH" --format oci --rm \
    "$app" "oci-archive:$OUT.partial:$IMAGE" >/dev/null
mv "$OUT.partial" "$OUT"
echo "$BUILD_KEY" >"$OUT.key"
echo "image: $OUT ($IMAGE), layers:"
tar -xOf "$OUT" index.json | .venv/bin/python -c '
import json, sys, tarfile
index = json.load(sys.stdin)
with tarfile.open(sys.argv[1]) as archive:
    manifest = index["manifests"][0]["digest"].replace(":", "/")
    layers = json.load(archive.extractfile(f"blobs/{manifest}"))["layers"]
for layer in layers:
    print("  %s  %.0f MiB" % (layer["digest"], layer["size"] / 2**20))
' "$OUT"

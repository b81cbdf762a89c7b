"""The POSIX shell scripts build, sign and preflight pods run (pure text).

``BUILD`` runs ``buildah build`` on the mounted Dockerfile and tags the result
``$KMM_IMAGE``; ``SIGN`` takes ``$KMM_UNSIGNED_IMAGE``, signs every file its
arguments (``filesToSign`` globs) match and commits ``$KMM_IMAGE``. Both run
under ``/bin/sh -c SCRIPT kmm-<role> ARGS...`` in the builder image
(scripts/build_builder_image.sh); ``podparts`` renders the containers, mounts
and environment they read.

Environment, besides what ``podparts`` mounts:

- ``KMM_PUSH`` (default ``true``): ``false`` keeps the image in the pod's
  buildah storage (an emptyDir shared by a pod's containers) and pushes
  nothing, so no registry receives a write; preflight pods use it.
- ``KMM_REGISTRY_CA_FILE`` (optional): a PEM bundle appended to the
  system's CAs before anything is pulled or pushed (``podparts`` mounts it).
- ``KMM_UNSIGNED_LOCAL`` (sign, default ``false``): ``true`` reads
  ``$KMM_UNSIGNED_IMAGE`` from that storage (``buildah from --pull=never``),
  where a preflight pod's build init container left it, instead of pulling.
- ``KMM_BUILD_HASH``, ``KMM_REBUILD_TRIGGER`` (build, optional): written as
  the image's labels ``kmm.api.labels.IMAGE_BUILD_HASH`` and
  ``IMAGE_REBUILD_TRIGGER``; the sign's labels are cleared (a base image
  may carry them). ``KMM_SIGN_HASH`` (sign, optional): the image gets
  ``IMAGE_SIGNED`` ``true``, ``IMAGE_SIGNING_CERT`` (sha256 of the
  certificate's DER form, computed here) and ``IMAGE_SIGN_HASH``, and keeps
  the build's. ``KMM_EXPECT_BUILD_HASH`` (sign, optional): the unsigned
  image must carry that build hash and ``KMM_REBUILD_TRIGGER``, or the sign
  exits ``STALE_EXIT`` without signing (the operator then builds again).
  Preflight pods set none of them.

What a container reports: on success one JSON line in its termination
message. Pushed: ``{"image": ..., "digest": "sha256:...", "pushed": true}``
(the manifest digest the registry has). Not pushed: ``{"image": ...,
"pushed": false, "imageId": "sha256:..."}``: no registry has the image, so
there is no manifest digest; ``imageId`` is the local image's ID (its config
digest), which names what was made inside the pod only. A sign adds
``"signed": [paths in the image]`` and ``"unmatched": [patterns]``. On
failure nothing is written, so the kubelet puts the log's tail there
(``FallbackToLogsOnError``), whose last line is the script's
``kmm-build: error: ...``/``kmm-sign: error: ...``. A sign that pulled its
unsigned image adds ``"unsignedDigest"``: the manifest digest it signed
(the operator deletes the build's intermediate image by it).
"""

from __future__ import annotations

from typing import Final

from kmm.api import labels

__all__ = ["BUILD", "SIGN", "STALE_EXIT"]

#: The sign's exit code when its unsigned image is not the build it expects.
STALE_EXIT: Final = 3

# Shared by both scripts: error lines, the registry CA, JSON strings, and the
# push-or-keep ending.
_COMMON: Final = r"""set -eu
fail() { echo "$0: error: $*" >&2; exit 1; }
say() { echo "$0: $*" >&2; }
case ${KMM_PUSH:=true} in
true | false) ;;
*) fail "KMM_PUSH must be true or false, not $KMM_PUSH" ;;
esac
# A PEM bundle the operator was given (a file: an environment variable
# holds at most 128 KiB): trusted besides Debian's CAs, for every registry
# (containers/image reads the system bundle).
if [ -n "${KMM_REGISTRY_CA_FILE:-}" ]; then
    [ -s "$KMM_REGISTRY_CA_FILE" ] || fail "the registry CA file $KMM_REGISTRY_CA_FILE is missing or empty"
    { echo; cat "$KMM_REGISTRY_CA_FILE"; echo; } >>/etc/ssl/certs/ca-certificates.crt ||
        fail "adding the registry CA to the system bundle failed"
fi
if [ -n "${REGISTRY_AUTH_FILE:-}" ] && [ ! -s "$REGISTRY_AUTH_FILE" ]; then
    fail "imageRepoSecret has no .dockerconfigjson"
fi
json() { printf '"%s"' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g')"; }
# finish FIELDS: push $KMM_IMAGE unless KMM_PUSH=false, then write the JSON
# summary, FIELDS (", "-led JSON members, may be empty) appended. /tmp/iid
# holds the local image's ID.
finish() {
    if [ "$KMM_PUSH" = false ]; then
        printf '{"image": %s, "pushed": false, "imageId": %s%s}\n' \
            "$(json "$KMM_IMAGE")" "$(json "$(cat /tmp/iid)")" "$1" >/dev/termination-log
        say "kept $KMM_IMAGE in this pod's storage, not pushed (KMM_PUSH=false)"
        return
    fi
    say "pushing $KMM_IMAGE"
    buildah push --tls-verify="$KMM_PUSH_TLS_VERIFY" --digestfile /tmp/digest "$KMM_IMAGE" ||
        fail "pushing $KMM_IMAGE failed"
    printf '{"image": %s, "digest": %s, "pushed": true%s}\n' \
        "$(json "$KMM_IMAGE")" "$(json "$(cat /tmp/digest)")" "$1" >/dev/termination-log
    say "pushed $KMM_IMAGE@$(cat /tmp/digest)"
}
"""


def _named(script: str) -> str:
    """``script`` with the label keys and the stale exit code filled in."""
    for mark, value in (
        ("@BUILD_HASH@", labels.IMAGE_BUILD_HASH),
        ("@REBUILD_TRIGGER@", labels.IMAGE_REBUILD_TRIGGER),
        ("@SIGNED@", labels.IMAGE_SIGNED),
        ("@SIGNING_CERT@", labels.IMAGE_SIGNING_CERT),
        ("@SIGN_HASH@", labels.IMAGE_SIGN_HASH),
        ("@STALE_EXIT@", str(STALE_EXIT)),
    ):
        script = script.replace(mark, value)
    return script


BUILD: Final = _named(
    _COMMON
    + r"""
# "$@": buildah build's arguments (--build-arg, --volume for build secrets).
[ -s /run/kmm/dockerfile/Dockerfile ] || fail "the Dockerfile ConfigMap key is missing or empty"
if [ -n "$(ls -A /host/lib/modules 2>/dev/null)" ]; then
    set -- "$@" --volume=/host/lib/modules:/host/lib/modules:ro
fi
# What made the image, in its config (the sign's labels cleared: a base
# image built by kmm would lend its own).
if [ -n "${KMM_BUILD_HASH:-}" ]; then
    set -- "$@" --label "@BUILD_HASH@=$KMM_BUILD_HASH" \
        --label "@REBUILD_TRIGGER@=${KMM_REBUILD_TRIGGER:-}" \
        --label "@SIGNED@=" --label "@SIGNING_CERT@=" --label "@SIGN_HASH@="
fi
mkdir -p /tmp/context
say "building $KMM_IMAGE"
# RUN steps keep the pod's limits: buildah would raise them to 1048576 as
# root, which needs CAP_SYS_RESOURCE.
buildah build --tls-verify="$KMM_PULL_TLS_VERIFY" --file /run/kmm/dockerfile/Dockerfile \
    --ulimit "nofile=$(ulimit -Sn):$(ulimit -Hn)" --ulimit "nproc=$(ulimit -Sp):$(ulimit -Hp)" \
    --iidfile /tmp/iid --tag "$KMM_IMAGE" "$@" /tmp/context ||
    fail "buildah build failed (see the lines above)"
finish ""
"""
)

SIGN: Final = _named(
    _COMMON
    + r"""
# "$@": the filesToSign patterns, shell globs of paths in the image.
[ "$#" -gt 0 ] || fail "no filesToSign"
key=/run/kmm/signing/key/key
cert=/run/kmm/signing/cert/cert
[ -s "$key" ] || fail "Secret $KMM_KEY_SECRET has no key 'key'"
[ -s "$cert" ] || fail "Secret $KMM_CERT_SECRET has no key 'cert'"
# sign-file reads a PEM key only: convert a DER one.
if openssl pkey -in "$key" -inform PEM -out /tmp/key.pem 2>/dev/null ||
    openssl pkey -in "$key" -inform DER -out /tmp/key.pem 2>/dev/null; then
    key=/tmp/key.pem
else
    fail "key 'key' of Secret $KMM_KEY_SECRET is not a PEM or DER private key"
fi
openssl x509 -in "$cert" -inform PEM -noout 2>/dev/null ||
    openssl x509 -in "$cert" -inform DER -noout 2>/dev/null ||
    fail "key 'cert' of Secret $KMM_CERT_SECRET is not a PEM or DER certificate"
# sign-file refuses a key that is not the certificate's too, but only after
# the pull and in OpenSSL's words: refuse it first, naming both Secrets.
certkey=$(openssl x509 -in "$cert" -inform PEM -pubkey -noout 2>/dev/null ||
    openssl x509 -in "$cert" -inform DER -pubkey -noout)
[ "$certkey" = "$(openssl pkey -in "$key" -pubout)" ] ||
    fail "the key of Secret $KMM_KEY_SECRET does not match the certificate of Secret $KMM_CERT_SECRET"
for pattern in "$@"; do
    case $pattern in
    "${KMM_DIR_NAME%/}"/*) ;;
    *) fail "filesToSign pattern $pattern is not under $KMM_DIR_NAME" ;;
    esac
done
if [ "${KMM_UNSIGNED_LOCAL:-false}" = true ]; then
    say "reading $KMM_UNSIGNED_IMAGE from this pod's storage"
    container=$(buildah from --quiet --pull=never "$KMM_UNSIGNED_IMAGE") ||
        fail "$KMM_UNSIGNED_IMAGE is not in this pod's storage"
else
    say "pulling $KMM_UNSIGNED_IMAGE"
    container=$(buildah from --quiet --pull=always --tls-verify="$KMM_PULL_TLS_VERIFY" "$KMM_UNSIGNED_IMAGE") ||
        fail "pulling $KMM_UNSIGNED_IMAGE failed"
fi
label() {
    buildah inspect --type container --format "{{index .OCIv1.Config.Labels \"$1\"}}" "$container"
}
if [ -n "${KMM_EXPECT_BUILD_HASH:-}" ]; then
    built=$(label "@BUILD_HASH@") || fail "reading the labels of $KMM_UNSIGNED_IMAGE failed"
    trigger=$(label "@REBUILD_TRIGGER@") || fail "reading the labels of $KMM_UNSIGNED_IMAGE failed"
    if [ "$built" != "$KMM_EXPECT_BUILD_HASH" ] || [ "$trigger" != "${KMM_REBUILD_TRIGGER:-}" ]; then
        echo "$0: error: $KMM_UNSIGNED_IMAGE is not the build of the Module's current inputs (build hash ${built:-none}, rebuild trigger ${trigger:-none}): not signed" >&2
        exit @STALE_EXIT@
    fi
fi
unsigned_digest=""
if [ "${KMM_UNSIGNED_LOCAL:-false}" != true ]; then
    unsigned_digest=$(buildah inspect --type container --format '{{.FromImageDigest}}' "$container") ||
        fail "reading the digest of $KMM_UNSIGNED_IMAGE failed"
fi
root=$(buildah mount "$container") || fail "mounting $KMM_UNSIGNED_IMAGE failed"
signed=""
unmatched=""
count=0
for pattern in "$@"; do
    found=0
    # Globs expand under the image's root; a pattern that matches nothing
    # stays itself and is not a file there.
    for file in "$root"$pattern; do
        [ -f "$file" ] || continue
        sign-file sha256 "$key" "$cert" "$file" || fail "sign-file failed on ${file#"$root"}"
        say "signed ${file#"$root"}"
        signed="$signed${signed:+, }$(json "${file#"$root"}")"
        found=1
        count=$((count + 1))
    done
    if [ "$found" = 0 ]; then
        say "no file matches $pattern"
        unmatched="$unmatched${unmatched:+, }$(json "$pattern")"
    fi
done
[ "$count" -gt 0 ] || fail "no file in $KMM_UNSIGNED_IMAGE matches filesToSign: $*"
buildah umount "$container" >/dev/null
if [ -n "${KMM_SIGN_HASH:-}" ]; then
    openssl x509 -in "$cert" -inform PEM -outform DER -out /tmp/cert.der 2>/dev/null ||
        openssl x509 -in "$cert" -inform DER -outform DER -out /tmp/cert.der ||
        fail "reading the certificate of Secret $KMM_CERT_SECRET failed"
    fingerprint=$(sha256sum /tmp/cert.der | cut -d ' ' -f 1)
    buildah config --label "@SIGNED@=true" --label "@SIGNING_CERT@=$fingerprint" \
        --label "@SIGN_HASH@=$KMM_SIGN_HASH" "$container" || fail "labelling the signed image failed"
fi
buildah commit --quiet --iidfile /tmp/iid "$container" "$KMM_IMAGE" >/dev/null ||
    fail "committing the signed image failed"
say "$count files signed"
source=""
[ -z "$unsigned_digest" ] || source=", \"unsignedDigest\": $(json "$unsigned_digest")"
finish ", \"signed\": [$signed], \"unmatched\": [$unmatched]$source"
"""
)

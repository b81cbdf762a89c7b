"""An OCI distribution client and an OCI-archive reader.

``client`` speaks the distribution API (manifests, blobs, monolithic
uploads) over ``transport`` (aiohttp exchanges with one host: redirects,
TLS, the guarded destinations) and ``authorizing`` (the ``/v2/`` challenge
met lazily: Basic, or Bearer tokens per repository); ``auth`` parses
challenges and finds credentials in a ``.dockerconfigjson``; ``trust`` loads
extra CAs and makes the TLS context; ``destinations`` says which addresses a
client dials for a host someone else named (no loopback, no link-local: the
cloud's metadata); ``archive`` reads the tar ``buildah commit ... oci-archive:``
writes; ``layouts`` writes and reads an OCI image layout directory (one
image, gzip layers made in one streaming pass); ``pushing`` copies an
archive's image to a registry. ``errors`` has
one type per outcome a caller decides on (credentials rejected, missing,
scope denied, not dialled, other), each with a text safe to show a tenant.

Limits: no cross-repository mounts, no chunked uploads (a blob is sent in one
PUT, held in memory), no manifest list assembly (an index is copied as is).
"""

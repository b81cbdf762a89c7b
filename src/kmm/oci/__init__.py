"""An OCI distribution client and an OCI-archive reader.

``client`` speaks the distribution API (the ``/v2/`` challenge, Basic and
Bearer auth, manifests and their redirects, monolithic blob uploads) over
aiohttp; ``auth`` parses challenges and finds credentials in a
``.dockerconfigjson``; ``destinations`` says which addresses a client dials
for a host someone else named (no loopback, no link-local: the cloud's
metadata); ``archive`` reads the tar ``buildah commit ... oci-archive:``
writes; ``pushing`` copies an archive's image to a registry. ``errors`` has
one type per outcome a caller decides on (credentials rejected, missing,
scope denied, not dialled, other), each with a text safe to show a tenant.

Limits: no cross-repository mounts, no chunked uploads (a blob is sent in one
PUT, held in memory), no manifest list assembly (an index is copied as is).
"""

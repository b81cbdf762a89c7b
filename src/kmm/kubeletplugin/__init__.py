"""A generic DRA kubelet plugin library: registration, the DRA gRPC services,
ResourceSlice publishing, CDI spec files and a checkpoint of prepared claims.

It knows nothing of any device: what exists and what a claim gets is decided by
its owner's policy. It never imports ``kmm.operator``.
"""

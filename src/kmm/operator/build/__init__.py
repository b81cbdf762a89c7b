"""Build and sign: kernel-module images made in the cluster when missing.

``existence`` asks registries whether an image exists and remembers it;
``hashing`` digests a pod's inputs; ``planner`` (pure) decides which build
and sign pods to create or delete and which (kernel, image) pairs wait for
their image; ``pods`` renders the pods. The reconciler runs this concern
before the loader's, which skips the pairs it gates. Nothing here writes to
the API server: the reconciler sends what the planner wants.
"""

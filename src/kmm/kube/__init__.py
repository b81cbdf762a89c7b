"""API access: the one layer through which kmm speaks to Kubernetes API servers.

::

    cli
    operator | driver | kubelet
    kubeletplugin | runtime | sandbox
    kube (this) | api               <- kube imports neither api nor anything above
    aio                             <- tasks, clocks, backoff

Nothing outside this package imports the HTTP transport (aiohttp; import-linter
keeps it so). Import modules, not names:

- ``kubeconfigs``: cluster access found as kubectl finds it (``load`` -> ``Access``);
- ``credentials``: tokens, token files, certificates, exec credential plugins;
- ``client``: ``Client``: one ``request`` function and one ``watch`` stream,
  retries in one place, a request counter (``counting``);
- ``connections``: the session a client sends over, TLS as the kubeconfig
  says, the client certificate loaded without touching a disk;
- ``errors``: the error tree, by what the caller can do;
- ``resources``: request paths (``Resource``) and the resources kmm uses;
- ``objects``: raw objects and the metadata read from each;
- ``listwatch`` + ``reflecting``: list-then-watch into a sink of one's own
  (the runtime's informers, the kubelet plugin's claim cache).
"""

__all__: list[str] = []

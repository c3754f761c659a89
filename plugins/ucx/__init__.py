"""The UCX transport plugins: ``tcp`` (the base transport, the transport mode and interface
settings, and what this host's UCX offers -- its facts section ``ucx_info``, :mod:`.ucx_info`;
essential), ``nvlink`` (``cuda_copy``, ``cuda_ipc``) and ``infiniband`` (``rc``,
rdmacm, the port nearest each GPU), with the rules they share (:mod:`.rules`).

Each module is one plugin; the package itself registers nothing.
"""

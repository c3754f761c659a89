"""The UCX transport plugins: ``tcp`` (the base transport, the transport mode and interface
settings; essential), ``nvlink`` (``cuda_copy``, ``cuda_ipc``) and ``infiniband`` (``rc``,
rdmacm, the port nearest each GPU), with the rules they share (:mod:`.rules`).

Each module is one plugin; the package itself registers nothing.
"""

"""The UCX transport plugins ``tcp``, ``nvlink`` and ``infiniband`` (one module each) and the rules they share."""

"""The scheduler-parity plugin: the scheduler has what the workers need.  :mod:`.plugin`
holds its hooks and the scheduler check; :mod:`.relay` the guard of a GPU-less UCX scheduler
(a plain client is told at connect, a failed gather of a GPU result says why).
"""

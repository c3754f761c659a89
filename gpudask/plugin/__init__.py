"""gpudask's plugin machinery: the hook contract (``hookspecs``), finding and registering
plugins (``registration``), calling them (``manager``, through ``hookcall``'s isolation),
checking what they return (``hookresults``) and tracing the calls (``hooktrace``).

Plugins themselves import :mod:`gpudask.pluginapi`, never these modules."""

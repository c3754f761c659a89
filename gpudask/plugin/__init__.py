"""gpudask's plugin machinery; plugins themselves import :mod:`gpudask.pluginapi`, never these modules."""

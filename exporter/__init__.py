"""resmon-exporter: GPU (NVML) and host resources for Prometheus and for in-process use.

    from resmon_exporter import ResourceMonitor
    ResourceMonitor().get_current_resources()
"""

import logging as _logging

from .logs import LOGGER_NAME as _LOGGER_NAME
from .monitor import ResourceMonitor
from .collectors.registry import ResourceCollector
from .version import __version__

# A library stays quiet unless the application configures logging.
_logging.getLogger(_LOGGER_NAME).addHandler(_logging.NullHandler())

__all__ = ["ResourceMonitor", "ResourceCollector", "__version__"]

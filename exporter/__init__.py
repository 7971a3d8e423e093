"""resmon-exporter: GPU (NVML) and host resources for Prometheus and for in-process use.

    from resmon_exporter import ResourceMonitor
    ResourceMonitor().get_current_resources()
"""

import logging as _logging

from .collectors.registry import ResourceCollector
from .config import KubernetesOptions, MonitorOptions, ProcessesOptions
from .logs import LOGGER_NAME as _LOGGER_NAME
from .monitor import ResourceMonitor
from .version import __version__

# A library stays quiet unless the application configures logging.
_logging.getLogger(_LOGGER_NAME).addHandler(_logging.NullHandler())

__all__ = ["ResourceMonitor", "ResourceCollector", "MonitorOptions", "ProcessesOptions", "KubernetesOptions", "__version__"]

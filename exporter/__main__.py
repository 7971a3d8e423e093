"""python -m resmon_exporter"""

import sys

from .cli import main

sys.exit(main())

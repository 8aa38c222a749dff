"""Entry point: ``python3 -m vm``."""

import sys

from vm.cli import main

sys.exit(main())

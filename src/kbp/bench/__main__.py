"""python -m kbp.bench [setup | report DIR | bench options]"""

import sys

from kbp.bench.cli import main

sys.exit(main())

"""python -m kbp.bench [setup | report DIR | vm [--flavour F] ... | bench options]"""

import sys

from kbp.bench.cli import main

sys.exit(main())

"""``python -m scripts.audit WHEEL [WHEEL ...]``."""

import sys

from scripts.audit.command import main

sys.exit(main())

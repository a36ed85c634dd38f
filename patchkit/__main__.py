"""``python -m patchkit``: the same command as the ``patchkit`` script."""

import sys

from .cli import main

sys.exit(main())

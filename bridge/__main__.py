"""``python -m bridge`` is the ``lmbridge`` command."""

import sys

from .cli import main

sys.exit(main())

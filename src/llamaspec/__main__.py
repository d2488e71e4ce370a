"""`python -m llamaspec`: the `llamaspec` command."""

import sys

from .cli import main

sys.exit(main())

"""`python -m gan.patterns`: see gan/patterns/cli.py."""

import sys

from gan.patterns.cli import main

sys.exit(main())

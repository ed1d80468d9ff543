"""`python -m gan.patterns`: see gan/patterns/claims.py."""

import sys

from gan.patterns.claims import main

sys.exit(main())

"""``python -m samai.remote.gateway``: the reference exec-envelope gateway."""

import sys

from samai.remote.gateway.cli import main

sys.exit(main())

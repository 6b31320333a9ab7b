import sys

from samai.console.cli import main

sys.exit(main())

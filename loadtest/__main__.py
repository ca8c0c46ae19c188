"""`python -m loadtest --config loadtest/ghz/<name>.json`: the ghz-compatible load runner."""

import sys

from loadtest.ghzlike.cli import main

sys.exit(main())

"""``python3 -m umprov.verify.agent ARGS``: the agent's command line (cli.py)."""

import sys

from .cli import main

sys.exit(main())

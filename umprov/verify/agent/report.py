"""The host report written out: by the command line (cli.py) and by the scheduler actions
(nodehealth.py), which cli.py starts; its own module so neither imports the other back."""

from __future__ import annotations

import json
import os
import sys


def write_report(path: str, doc: dict) -> None:
    """To stdout ('-'), else whole or not at all (a temporary file, then a rename)."""
    text = json.dumps(doc, indent=2, default=str)
    if path == "-":
        sys.stdout.write(text + "\n")
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text + "\n")
    os.replace(tmp, path)

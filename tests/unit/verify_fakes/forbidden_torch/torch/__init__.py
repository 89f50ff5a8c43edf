"""A torch that must never be imported (the passive mode): importing it leaves a mark in the
file UMPROV_TORCH_IMPORTED names, and fails."""

import os

with open(os.environ["UMPROV_TORCH_IMPORTED"], "a") as fh:
    fh.write("torch was imported\n")
raise RuntimeError("torch was imported")

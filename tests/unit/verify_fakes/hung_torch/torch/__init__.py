"""A torch whose import never returns (a hung driver call): the agent's child must be killed at
its deadline and its check reported as a timeout."""

import time

while True:
    time.sleep(3600)

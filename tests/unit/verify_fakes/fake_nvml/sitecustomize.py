"""Put on PYTHONPATH with UMPROV_FAKE_NVML=FILE (a fake_nvml_lib description): every process
of the agent's run then sees the fake driver library instead of libnvidia-ml.so.1."""

import json
import os

from fake_nvml_lib import install

if os.environ.get("UMPROV_FAKE_NVML"):
    with open(os.environ["UMPROV_FAKE_NVML"]) as fh:
        install(json.load(fh))

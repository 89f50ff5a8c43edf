"""Run every CPU-side benchmark in turn; results land in bench/results/*.json."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
BENCHES = ["cli_startup.py", "lab_up.py", "deploy_bench.py"]

for bench in BENCHES:
    print(f"== {bench}", flush=True)
    subprocess.run([sys.executable, str(HERE / bench), *sys.argv[1:]], check=True, cwd=HERE)

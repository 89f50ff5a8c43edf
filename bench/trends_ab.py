"""The trends report (``umprov report --html``) from two checkouts, interleaved in one run.

    .venv/bin/python bench/trends_ab.py /tmp/old-checkout . [--hosts 1000] [--rounds 2]

Each checkout's own ``umprov.verify`` renders the same history (the fleet of
tests/fleet_docs.py saved three times, 3,000 host runs at 1,000 hosts) into the report with
every host's trends, and, as the baseline of the same round, the same report without trends.
Each round runs every checkout once, in a fresh process, one after the other.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import save  # noqa: E402

ONE = r"""
import json, sys, tempfile, time
from pathlib import Path
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import fleet_docs
from umprov.verify import history, html
docs = fleet_docs.fleet(int(sys.argv[3]), gpus=8)
with tempfile.TemporaryDirectory() as tmp:
    root = Path(tmp) / "h"
    for _ in range(3):
        history.save(docs, root=root, retention=history.Retention(3650, 1 << 34, 1000))
    entries = history.load(root=root)
    trends, latest = history.trends(entries), history.latest_docs(entries)
    t = time.perf_counter(); html.write(Path(tmp) / "t.html", latest, trends=trends)
    with_s = time.perf_counter() - t
    t = time.perf_counter(); html.write(Path(tmp) / "p.html", latest)
    print(json.dumps({"with_trends_s": with_s, "without_s": time.perf_counter() - t}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkouts", nargs="+", type=Path)
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {str(c): [] for c in args.checkouts}
    for _ in range(args.rounds):
        for checkout in args.checkouts:
            out = subprocess.run([sys.executable, "-c", ONE, str(checkout.resolve()),
                                  str(HERE.parent / "tests"), str(args.hosts)],
                                 capture_output=True, text=True, check=True).stdout
            runs[str(checkout)].append(json.loads(out))
    result = {}
    for checkout, rows in runs.items():
        med = {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]}
        med["trends_cost_s"] = round(med["with_trends_s"] - med["without_s"], 2)
        result[checkout] = {**med, "rounds": rows}
        print(f"{checkout}: with trends {med['with_trends_s']} s, without {med['without_s']} s"
              f" (trends {med['trends_cost_s']} s)", file=sys.stderr)
    save("trends_ab", {"hosts": args.hosts, "checkouts": result})


if __name__ == "__main__":
    main()

#!/bin/bash
# Issue 38's open measurements, each a stage under its own time limit (a device call gives at
# most 600 s), results in $OUT (the device tool's folder) or bench/results/:
#
#   bench/verify_levers.sh [STAGE ...]   # default: costs figures gputests
#
# costs: bench/agent_costs.py (NCCL's communicator under settings, the bf16 GEMM over a burst
# with its clock and power); figures: bench/verify_figures.py, 5 full and 3 quick runs, the
# floor, and an A/B against the agent build $OLD (default .abold/agent-25fe1ed.pyz, the agent
# before NCCL's communicator left the GPU's lock; bench/agent_at.sh 25fe1ed builds it: carry
# .abold); gputests: the verifier's GPU tests.
set -u
ALL="costs figures gputests"
. "$(dirname "$0")/_stages.sh"
pick_stages "$ALL" "$@"
export NCCL_NVLS_ENABLE=0 UMPROV_BENCH_OUT=$out
old=${OLD:-.abold/agent-25fe1ed.pyz}
for s in $stages; do
    case $s in
        costs) timeout 120 python3 bench/agent_costs.py > "$out/costs.txt" 2>&1 ;;
        figures)
            ab=()
            [ -f "$old" ] && ab=(--old "$old" --ab 2)
            timeout 300 python3 bench/verify_figures.py --runs 5 --quick-runs 3 --floor 2 \
                --cold 0 "${ab[@]}" > "$out/figures.txt" 2>&1 ;;
        gputests)
            timeout 200 env PYTHONPATH=. python3 -m pytest -q -p no:cacheprovider \
                tests/gpu/test_verify_gpu.py > "$out/gputests.txt" 2>&1 ;;
    esac
    echo "$s rc=$?"
    tail -12 "$out/$s.txt"
done

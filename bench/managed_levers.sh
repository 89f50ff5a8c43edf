#!/bin/bash
# Issue 36's open measurements, each a stage with its own time limit, so one lease (600 s a
# call) runs what it can and keeps what it got (bench/README.md, "Open measurements").
#
#   bench/managed_levers.sh [STAGE ...]   # default: all, in this order
#
# early: fp32 AdamW rows with FSDP2's CPU offload and the fitting size (300 s on the H100 of
# 2026-12-07); gradroom: gradients down and torchao as they are (the room held back from
# forward), then gradients down with no headroom (nothing held back) and with 256 MiB (run L,
# 512 MiB and nothing held back: 10.3 of 11.25 GiB of gradients spilled; run J, before the
# headroom, none); curve: the 20-step loss curve, host step against device-only training;
# deepspeed: ZeRO-Offload (its wheels in .whl/deepspeed-deps/, DeepSpeedCPUAdam built first)
# beside torchao and gradients down, fp32 and bf16; homes, expandable, lag: fp32 AdamW rows
# under settings; optims: fused AdamW, SGD with momentum and bf16 autocast; mlp: the MLP
# model; tight: 9 GiB left (10 layers), where torchao's offload keeps too much on the GPU to
# run; headroom: bf16 AdamW with and without the headroom CUDA keeps
# (UMPROV_MANAGED_HEADROOM=0 died in run J); discard; gputests.
#
# On the GPU host, from the repository root, with torchao's wheel carried in .whl/. Results in
# $OUT (the device tool's folder) or bench/results/, one .json and one .txt a stage; torchao's
# row is in every speed stage: leases differ by up to 20 % and only rows of one call compare.
set -u
ALL="early gradroom curve deepspeed homes discard expandable lag optims mlp tight headroom gputests"
. "$(dirname "$0")/_stages.sh"
pick_stages "$ALL" "$@"
export NCCL_NVLS_ENABLE=0
python3 -m pip install -q --no-deps .whl/torchao-*.whl 2>&1 | tail -2
peers() {  # stage, time limit, rows, then more arguments (--managed DIR)
    local stage=$1 limit=$2 rows=$3
    shift 3
    timeout "$limit" python3 bench/managed_peers.py --left-gib 16 --layers 15 --steps 5 \
        --timeout 100 --only "$rows" "$@" --out "$out/$stage.json" > "$out/$stage.txt" 2>&1
    echo "$stage rc=$?"
    tail -6 "$out/$stage.txt"
}
lag_copy() {  # the managed modules with gradients down holding 1 GiB in flight (before run H)
    local dir="$out/lag-managed"
    mkdir -p "$dir"
    cp docker/pytorch-cuda/managed/* "$dir/"
    sed -i 's/^LAG = 256 << 20/LAG = 1 << 30/' "$dir/umprov_managed_grads.py"
    grep -q '^LAG = 1 << 30' "$dir/umprov_managed_grads.py" || { echo "lag: LAG not found" >&2; return 1; }
    echo "$dir"
}
ROWS=pool:adamw:fp32,pool_grads_down:adamw:fp32,torchao:adamw:fp32
DOWN=pool_grads_down:adamw:fp32,torchao:adamw:fp32
FITS=fit:default,fit:pool,fit:pool_grads_down
OPTIMS=pool_grads_down:adamw_fused:fp32,torchao:adamw_fused:fp32,pool_grads_down:sgd:fp32
OPTIMS=$OPTIMS,torchao:sgd:fp32,pool_grads_down:adamw:bf16,torchao:adamw:bf16
for s in $stages; do
    case $s in
        early) peers early 330 "$ROWS,fsdp2:adamw:fp32,$FITS" ;;
        curve) peers curve 100 curve:default,curve:pool_host_step ;;
        gradroom)
            peers gradroom 130 "$DOWN"
            UMPROV_MANAGED_HEADROOM=0 peers gradroom-0 70 pool_grads_down:adamw:fp32
            UMPROV_MANAGED_HEADROOM=256m peers gradroom-256m 70 pool_grads_down:adamw:fp32 ;;
        deepspeed)
            python3 -m pip install -q --no-deps .whl/deepspeed-deps/*.whl 2>&1 | tail -2
            export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch-extensions}
            # ninja where pip put it, beside this python
            PATH="$(dirname "$(command -v python3)"):$PATH"
            if ! timeout 150 python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder
CPUAdamBuilder().load()" > "$out/deepspeed-build.txt" 2>&1; then
                echo "deepspeed: DeepSpeedCPUAdam did not build; torch's fused AdamW instead"
                tail -3 "$out/deepspeed-build.txt"
                export UMPROV_BENCH_DS_TORCH_ADAM=1
            fi
            peers deepspeed 330 "$DOWN,deepspeed:adamw:fp32,pool_grads_down:adamw:bf16,deepspeed:adamw:bf16" ;;
        homes) peers homes 170 "$ROWS" ;;
        discard)
            timeout 60 python3 bench/managed_discard.py > "$out/discard.txt" 2>&1
            echo "discard rc=$?"
            tail -8 "$out/discard.txt" ;;
        expandable) PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True peers expandable 170 "$ROWS" ;;
        lag) dir=$(lag_copy) && peers lag 120 "$DOWN" --managed "$dir" ;;
        optims) peers optims 300 "$OPTIMS" ;;
        mlp) peers mlp 240 "$ROWS,$FITS" --model mlp --layers 6 ;;
        tight) peers tight 340 "$DOWN,pool_weights_out:adamw:fp32,fsdp2:adamw:fp32" \
                   --left-gib 9 --layers 10 ;;
        headroom)
            peers headroom 120 pool_grads_down:adamw:bf16,pool:adamw:bf16
            UMPROV_MANAGED_HEADROOM=0 peers headroom-off 100 pool_grads_down:adamw:bf16 ;;
        gputests)
            timeout 450 env PYTHONPATH=. python3 -m pytest -q -p no:cacheprovider \
                tests/gpu/test_managed_compat_gpu.py tests/gpu/test_managed_allocator_gpu.py \
                > "$out/gputests.txt" 2>&1
            echo "gputests rc=$?"
            tail -12 "$out/gputests.txt" ;;
    esac
done

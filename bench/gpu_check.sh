#!/usr/bin/env bash
# GPU check of the C-RL trainer and the local model engine, for a CUDA machine without network access.
#
# Run from the repository root:
#   bash bench/gpu_check.sh --prepare   here, with network to the package registry: fills .whl/ (see below)
#   bash bench/gpu_check.sh             on the GPU machine, e.g. through the device tool:
#                                       run(command="bash bench/gpu_check.sh", carry=[".whl"], timeout_s=430)
#
# The machine is expected to hold torch (CUDA), transformers, accelerate, peft, pyarrow, ... but not the
# project's other dependencies: those travel as wheels in .whl/ (listed with versions in
# bench/gpu_requirements.txt; never committed) and are installed into $GPU_CHECK_SITE. The SmolLM2-135M
# weights do not fit the transfer limit, so .whl/smollm2-shape/ carries only its config and tokenizer and
# stage (c) times a model of exactly that shape with random weights.
#
# Stages, each with its own time limit; a failed stage is reported and the next one still runs:
#   g. bench/gpu_check.py before anything is installed: the engine and the trainer's update on cuda with
#      torch and transformers alone (bf16, memory per step, tokens/s; OUT/gpu_check/gpu_check.json);
#   0. versions and nvidia-smi; an import smoke test of the whole `colab-graphs train` chain (fails fast);
#   a. `colab-graphs train --config examples/train_tiny.yaml` with the policy on cuda (tiny-random, 8 steps);
#   b. local engine: 16 concurrent requests batched vs one at a time (bench/local_batching.py, tiny-random);
#   c. the same two on a SmolLM2-135M-shaped random model (30 layers, hidden 576, SmolLM2's tokenizer);
#   d. stage a again with the policy on this machine's CPU, for comparison.
#
# Outputs under $OUT (default runs/gpu_check): gpu_check.log, results.json (the measured figures), the
# metrics.jsonl of each training run.
#
# Environment (for trying the script on a machine without a GPU):
#   PY                      Python command (default python3; may hold options, e.g. "python -S")
#   GPU_CHECK_SITE          where the wheels go (default /tmp/site); prepended to PYTHONPATH
#   GPU_CHECK_WHL           wheel folder (default .whl); GPU_CHECK_SKIP_INSTALL=1 skips the install
#   GPU_CHECK_EXTRA_PATH    further PYTHONPATH entries after the site (default none)
#   GPU_CHECK_STAGES        stages to run after g and the smoke test (default "a b c d"; GPU_CHECK_SKIP_G=1
#                           skips stage g)
#   GPU_CHECK_MAX_STEPS     training steps per run (default: the config's, 8)
#   GPU_CHECK_REQUESTS      concurrent requests in the batching stages (default 16)
#   GPU_CHECK_DEADLINE_S    seconds after the start by which every stage must end (default 380): a stage's
#                           limit is cut to what is left, and a stage with under 20 s left is skipped

set -u
PY=${PY:-python3}
SITE=${GPU_CHECK_SITE:-/tmp/site}
WHL=${GPU_CHECK_WHL:-.whl}
STAGES=${GPU_CHECK_STAGES:-a b c d}
REQUESTS=${GPU_CHECK_REQUESTS:-16}
DEADLINE=${GPU_CHECK_DEADLINE_S:-380}
export GPU_CHECK_MAX_STEPS=${GPU_CHECK_MAX_STEPS:-}
OUT=${OUT:-runs/gpu_check}
WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}
if [ "${1:-}" = "--prepare" ]; then
    # The wheels of bench/gpu_requirements.txt for Python 3.12 on manylinux x86_64, litellm without its admin
    # UI (to stay under the 64 MiB transfer limit), and SmolLM2-135M's config and tokenizer (no weights).
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    mkdir -p "$WHL"
    for req in $(grep -v '^#' bench/gpu_requirements.txt); do
        $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHL" "$req" || exit 1
    done
    $PY - "$WHL" <<'EOF' || exit 1
import glob, os, sys, zipfile
src = glob.glob(os.path.join(sys.argv[1], "litellm-*.whl"))[0]
drop = "litellm/proxy/_experimental/out/"
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(src + ".tmp", "w", zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist():
        if info.filename.startswith(drop):
            continue
        data = zin.read(info.filename)
        if info.filename.endswith(".dist-info/RECORD"):  # keep RECORD true to the files that remain
            data = "".join(f"{x}\n" for x in data.decode().splitlines() if not x.startswith(drop)).encode()
        zout.writestr(info, data)
os.replace(src + ".tmp", src)
EOF
    folder=$($PY -c 'from colab_graphs.local.zoo import resolve; print(resolve("smollm2-135m"))') || exit 1
    mkdir -p "$WHL/smollm2-shape"
    for f in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
        cp "$folder/$f" "$WHL/smollm2-shape/" || exit 1
    done
    du -sh "$WHL"
    exit 0
fi

mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/gpu_check.log
STARTED=$(date +%s)

log() { echo "[gpu_check +$(($(date +%s) - STARTED))s] $*" | tee -a "$LOG"; }

# Runs "$@" under a time limit, output to the log; records the stage status in $WORK/status.
stage() {
    local name=$1 limit=$2
    shift 2
    local left=$((DEADLINE - ($(date +%s) - STARTED)))
    if [ "$left" -lt 20 ]; then
        log "stage $name: SKIPPED (${left}s left before the deadline)"
        echo "$name skipped 0" >>"$WORK/status"
        return 125
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    log "stage $name: start (limit ${limit}s): $*"
    local t0=$(date +%s)
    timeout --signal=TERM --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
    local rc=$?
    log "stage $name: rc=$rc in $(($(date +%s) - t0))s"
    echo "$name $rc $(($(date +%s) - t0))" >>"$WORK/status"
    return $rc
}

: >"$LOG"
: >"$WORK/status"
if [ "${GPU_CHECK_SKIP_G:-0}" != 1 ]; then
    # Before the wheels: what a machine with only torch and transformers runs (the script's own stage 4, the
    # real trainer, runs here only if TRL, LiteLLM and LangGraph were already installed).
    PYTHONPATH=$PWD${GPU_CHECK_EXTRA_PATH:+:$GPU_CHECK_EXTRA_PATH} stage g 200 $PY bench/gpu_check.py --out "$OUT/gpu_check"
fi
if [ "${GPU_CHECK_SKIP_INSTALL:-0}" != 1 ]; then
    log "installing $(ls "$WHL"/*.whl | wc -l) wheels from $WHL into $SITE"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHL"/*.whl >>"$LOG" 2>&1 || { log "FAILED: wheel install (see above)"; exit 2; }
fi
export PYTHONPATH=$SITE${GPU_CHECK_EXTRA_PATH:+:$GPU_CHECK_EXTRA_PATH}:$PWD
export COLAB_GRAPHS_HOME=$WORK/home PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_OFFLINE_MODE=true TRL_EXPERIMENTAL_SILENCE=1

log "python: $($PY --version 2>&1) at $($PY -c 'import sys; print(sys.executable)')"
nvidia-smi >>"$LOG" 2>&1 || log "nvidia-smi: not available"
$PY - >>"$LOG" 2>&1 <<'EOF'
import importlib.metadata as md
names = ("torch transformers trl datasets peft accelerate litellm langgraph langchain-core pydantic "
         "huggingface-hub tokenizers safetensors pyarrow dill fsspec numpy openai httpx aiohttp").split()
for name in names:
    try:
        print(f"version {name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"version {name} MISSING")
# What the carried wheels declare against what this machine has (pip install --no-deps checks nothing).
import os
from packaging.requirements import Requirement
site = os.environ["PYTHONPATH"].split(":")[0]
for dist in md.distributions(path=[site]):
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            print(f"requirement {dist.metadata['Name']}: {req} -> MISSING")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            print(f"requirement {dist.metadata['Name']}: {req} -> have {have}")
EOF

stage smoke 300 $PY - <<'EOF'
import time
t0 = time.perf_counter()
import colab_graphs._env  # noqa: F401
import torch
print("torch", torch.__version__, "cuda available:", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
import litellm, langgraph, langchain_core, pydantic, datasets, trl, transformers  # noqa: E401,F401
from trl import GRPOConfig, GRPOTrainer  # noqa: F401
from colab_graphs.trainers.grpo import CRLTrainer  # noqa: F401
from colab_graphs.trainers.pipeline import train  # noqa: F401
from colab_graphs.local.provider import get_engine  # noqa: F401
import colab_graphs.cli.app  # noqa: F401
print(f"imports ok in {time.perf_counter() - t0:.1f} s")
EOF
if [ $? -ne 0 ]; then
    log "FAILED: the import smoke test (see the traceback above); stopping before training"
    exit 3
fi

# A training config derived from examples/train_tiny.yaml: $1 name, $2 use_cpu, $3 policy_model or "".
make_config() {
    $PY - "$1" "$2" "$3" "$WORK" <<'EOF'
import os, sys
from pathlib import Path
import yaml
name, use_cpu, policy, work = sys.argv[1:]
data = yaml.safe_load(Path("examples/train_tiny.yaml").read_text())
data.update(use_cpu=use_cpu == "1", output_dir=f"{work}/{name}")
if policy:
    data["policy_model"] = policy
if os.environ.get("GPU_CHECK_MAX_STEPS"):
    data["max_steps"] = int(os.environ["GPU_CHECK_MAX_STEPS"])
Path(f"{work}/{name}.yaml").write_text(yaml.safe_dump(data))
EOF
}

# The CLI in process, so that the GPU memory it used can be read afterwards.
cat >"$WORK/train_cli.py" <<'EOF'
import json, sys, time
config, name = sys.argv[1:]
import torch
sys.argv = ["colab-graphs", "train", "--config", config, "--no-cache"]
from colab_graphs.cli.app import main
t0, code = time.perf_counter(), 0
try:
    main()
except SystemExit as exc:
    code = exc.code or 0
cuda = torch.cuda.is_available()
print("TRAIN_RESULT " + json.dumps({
    "run": name, "rc": code, "process_s": round(time.perf_counter() - t0, 2),
    "cuda_max_allocated_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None,
}))
sys.exit(code)
EOF

run_training() {  # $1 name, $2 use_cpu, $3 policy, $4 limit
    make_config "$1" "$2" "$3" && stage "train_$1" "$4" $PY "$WORK/train_cli.py" "$WORK/$1.yaml" "$1"
    cp "$WORK/$1/metrics.jsonl" "$OUT/$1_metrics.jsonl" 2>/dev/null
    cp "$WORK/$1/summary.json" "$WORK/$1_summary.json" 2>/dev/null
}

cat >"$WORK/build_smol_shape.py" <<'EOF'
import shutil, sys, time
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM
src, dst = map(Path, sys.argv[1:])
t0 = time.perf_counter()
shutil.copytree(src, dst, dirs_exist_ok=True)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(dst), dtype=torch.float32)
model.save_pretrained(dst)
print(f"SmolLM2-shaped random model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
      f"built in {time.perf_counter() - t0:.1f} s")
EOF

for s in $STAGES; do
    case $s in
    a) run_training crl_gpu 0 "" 240 ;;
    b) stage batching_tiny 180 $PY bench/local_batching.py --model tiny-random --requests "$REQUESTS" --max-tokens 64 ;;
    c)
        if stage build_smol_shape 120 $PY "$WORK/build_smol_shape.py" "$WHL/smollm2-shape" "$WORK/smollm2-shape"; then
            stage batching_smolshape 180 $PY bench/local_batching.py --model "$WORK/smollm2-shape" \
                --requests "$REQUESTS" --max-tokens 64
            run_training crl_smolshape_gpu 0 "$WORK/smollm2-shape" 240
        fi
        ;;
    d) run_training crl_cpu 1 "" 240 ;;
    esac
done

$PY - "$LOG" "$WORK" "$OUT/results.json" >>"$LOG" 2>&1 <<'EOF'
import json, re, statistics, sys
from pathlib import Path
log, work, dest = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
text = log.read_text(errors="replace")
res = {"stages": {}, "versions": dict(re.findall(r"^version (\S+) (\S+)$", text, re.M))}
for line in (work / "status").read_text().splitlines():
    name, rc, secs = line.split()
    res["stages"][name] = {"rc": rc if rc == "skipped" else int(rc), "s": int(secs)}
gpu = re.search(r"torch \S+ cuda available: (\w+) ?(.*)", text)
res["gpu"] = gpu.group(2).strip() if gpu else None
finished = {r["run"]: r for r in map(json.loads, re.findall(r"^TRAIN_RESULT (.*)$", text, re.M))}
for stage in [s for s in res["stages"] if s.startswith("train_")]:
    # A run cut off by its time limit printed no TRAIN_RESULT: its metric lines still count.
    run = finished.get(stage[len("train_"):], {"run": stage[len("train_"):], "rc": res["stages"][stage]["rc"]})
    metrics = work / run["run"] / "metrics.jsonl"
    if metrics.exists():
        lines = [json.loads(x) for x in metrics.read_text().splitlines() if x]
        times = [x["step_time"] for x in lines if x.get("step_time") is not None]
        run["steps"] = len(lines)
        run["step_time_s"] = [round(t, 3) for t in times]
        run["median_step_time_after_first_s"] = round(statistics.median(times[1:] or times), 3) if times else None
        run["system_reward_by_step"] = [x.get("system_reward") for x in lines]
    summary = work / f"{run['run']}_summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        run.update(wall_s=s.get("wall_s"), eval_before=s.get("eval_before"), eval_after=s.get("eval_after"))
    res[run["run"]] = run
# bench/local_batching.py prints one block per run, in stage order (tiny-random, then the SmolLM2 shape).
blocks = re.findall(r"(machine: .*?speed-up: ([\d.]+)x\s+identical outputs: (\w+))", text, re.S)
for key, (block, ratio, same) in zip(("batching_tiny", "batching_smolshape"), blocks):
    nums = re.findall(r"(one at a time|batched):\s+([\d.]+) s\s+([\d.]+) tok/s", block)
    res[key] = {"speedup": float(ratio), "identical_outputs": same == "True",
                **{f"{k.replace(' ', '_')}_s": float(s) for k, s, _ in nums},
                **{f"{k.replace(' ', '_')}_tok_s": float(t) for k, _, t in nums},
                "header": block.splitlines()[:2]}
dest.write_text(json.dumps(res, indent=2) + "\n")
print(json.dumps(res, indent=2))
EOF
log "done: results in $OUT/results.json"

#!/usr/bin/env bash
# The GPU suite in one call: devices and versions, the `gpu`-marked tests, `zoo bench` against
# the PyTorch peer for every GPU preset, and a closing table. Finishes within its time budget
# (default 520 s) even when steps fail or hang: each step has a time limit, a failed step is
# logged and the next one runs.
#
#   benchmarks/gpu.sh RESULTS_DIR              on the GPU machine (docs/benchmarks.md)
#   benchmarks/gpu.sh --dry-run RESULTS_DIR    rehearsal on the CPU: tiny presets, few steps
#   benchmarks/gpu.sh --archive FILE.tar.gz RESULTS_DIR
#                                              also pack RESULTS_DIR into one archive, again
#                                              after every step (a killed run keeps the last)
#
# RESULTS_DIR receives environment.json, presets.jsonl, pytest-gpu.xml, one bench-*.json per
# row, steps.tsv (step, status, seconds, note), summary.json, logs/<step>.log and profile/ (the
# `zoo bench --profile` summaries, HLO and traces of the rows that ask for one). The archive
# leaves out the xprof .xplane.pb files, and the traces too if it would pass 15 MiB.
#
# Environment (all optional):
#   ZOO_GPU_PRESETS    rows to bench, one per line (or separated by ";"); PROFILE in a row
#                      stands for RESULTS_DIR/profile:
#                      "PRESET BATCH SEQ [more zoo bench options]"; a preset that
#                      `zoo presets` does not list is skipped with a note
#   ZOO_GPU_BENCH_ARGS options given to every row before its own (steps, warm-up, precision)
#   ZOO_GPU_BUDGET_S   seconds for the whole script (default 520; dry run 420)
#   ZOO_GPU_ROW_S      time limit of one bench row (default 200)
#   ZOO_GPU_ROW_MIN_S  a row is not started with less time left than this (default 60; dry 10)
#   ZOO_GPU_TESTS      0 skips the pytest step
#   ZOO_NANOGPT        nanoGPT's folder (bench.py, model.py, configurator.py) for the
#                      "nanogpt BATCH SEQ" row; default: .peers/nanogpt of the checkout (git-
#                      ignored: copy ../shared/peers/nanogpt there and carry it to the GPU
#                      machine), else ../shared/peers/nanogpt
#   ZOO_GPU_DATA       the rotten_tomatoes folder of the "finetune BATCH SEQ" row (LoRA on
#                      SmolLM2-135M's shapes, zoo against TRL: benchmarks/finetune_peer.py);
#                      default: .gpu-data/rotten_tomatoes of the checkout (git-ignored: copy
#                      ../shared/data/rotten_tomatoes there and carry it), else
#                      ../shared/data/rotten_tomatoes. TRL is not on the GPU machine: put its
#                      wheel in .whl/ (pip download --no-deps trl -d .whl)
#   PYTHON             the interpreter (default python3)
#
# Wheels the machine lacks (beartype for pytest's jaxtyping hook; datasets): put them in the
# git-ignored .whl/ of the checkout (cp ../shared/gpu-wheels/*.whl .whl/) and carry .whl to the
# machine; they are installed into .site/ and put on PYTHONPATH.
set -u -o pipefail

dry_run=0
results=""
archive=""
while [ "$#" -gt 0 ]; do
    case "$1" in
        --dry-run) dry_run=1 ;;
        --archive)
            [ "$#" -ge 2 ] || { echo "gpu.sh: --archive needs a file name" >&2; exit 2; }
            archive="$2"
            shift
            ;;
        -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
        -*) echo "gpu.sh: unknown option $1 (expected --dry-run, --archive FILE)" >&2; exit 2 ;;
        *) results="$1" ;;
    esac
    shift
done
if [ -z "$results" ]; then
    echo "gpu.sh: usage: benchmarks/gpu.sh [--dry-run] [--archive FILE.tar.gz] RESULTS_DIR" >&2
    exit 2
fi

mkdir -p "$results/logs" || exit 2
results="$(cd "$results" && pwd)"  # absolute: the steps run from the checkout's root
if [ -n "$archive" ]; then
    mkdir -p "$(dirname "$archive")" || exit 2
    archive="$(cd "$(dirname "$archive")" && pwd)/$(basename "$archive")"
fi
# pack: RESULTS_DIR into the archive, written aside and renamed, so the archive is always whole
pack() {
    [ -n "$archive" ] || return 0
    local parent name
    parent="$(dirname "$results")" name="$(basename "$results")"
    tar -czf "$archive.part" --exclude='*.xplane.pb' -C "$parent" "$name" 2> /dev/null
    if [ "$(stat -c %s "$archive.part" 2> /dev/null || echo 0)" -gt $((15 * 1024 * 1024)) ]; then
        tar -czf "$archive.part" --exclude='*.xplane.pb' --exclude='*.trace.json.gz' \
            -C "$parent" "$name" 2> /dev/null
    fi
    mv -f "$archive.part" "$archive"
}
cd "$(dirname "$0")/.." || exit 2
PYTHON="${PYTHON:-python3}"
: > "$results/steps.tsv"

# The rows, most important first (the budget cuts the last ones). Every row runs zoo's own
# defaults: the options below choose what is measured (shapes, the peer, a profile), never how
# zoo runs. GPU: the published shapes in bf16 against the peer (sdpa; eager and torch.compile,
# bf16 autocast) and the plain-JAX floor (the same model without zoo's code: gpt2, bert-base and
# decoding); nanoGPT's bench.py right after zoo's gpt2 row, on the same GPU in the same
# call ("nanogpt BATCH SEQ"); the LoRA fine-tune against TRL; batch-1 decoding for the
# weight-bandwidth floor; smollm2-135m (its peer is LlamaForCausalLM, compiled: fewer timed
# steps keep the row within its limit).
# The mixture of experts: OLMoE-1B-7B's widths (64 experts, top-8) cut to 2 layers, zoo's
# ragged (grouped matmul) and dense paths against transformers' OlmoeForCausalLM (eager).
# The training rows also profile zoo's step (PROFILE is replaced by RESULTS_DIR/profile): a
# short call of its own after the timed row, zoo alone, with XLA's command buffers off.
GPU_PRESETS="
gpt2 16 1024 --peer torch --peer-compile --peer floor --profile PROFILE
nanogpt 16 1024
finetune 16 512 --random-preset smollm2-135m --steps 30
bert-base 32 512 --peer torch --peer-compile --peer floor --profile PROFILE
transformer-base 32 128 --peer torch --peer-compile
gpt2 1 128 --decode-prompt 128 --decode-tokens 256 --steps 5 --peer torch --peer floor
smollm2-135m 16 1024 --peer torch --peer-compile --steps 6 --rounds 3 --warmup 1
olmoe-1b-7b 8 1024 --num-layers 2 --moe-path ragged,dense --peer torch --decode-tokens 0 --steps 6 --rounds 3 --warmup 1
"
GPU_BENCH_ARGS="--precision bf16 --steps 10 --warmup 2 --rounds 5"
# Dry run: the same rows on tiny presets, so every code path but the GPU's runs on the CPU.
DRY_PRESETS="
gpt-tiny 4 32 --peer torch --peer-compile --peer floor --profile PROFILE
nanogpt 4 32
classifier-tiny 4 32 --peer torch
translator-tiny 4 32 --peer torch
llama-tiny 4 32 --peer torch
gpt-tiny 1 16 --decode-prompt 8 --decode-tokens 16 --peer torch
finetune 2 128 --random-preset llama-tiny --steps 2
olmoe-tiny 2 16 --moe-path ragged,dense --peer torch --decode-tokens 0
"
DRY_BENCH_ARGS="--precision bf16 --steps 2 --warmup 0 --rounds 2 --decode-prompt 8 --decode-tokens 8"

if [ "$dry_run" = 1 ]; then
    export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
    presets="${ZOO_GPU_PRESETS:-$DRY_PRESETS}"
    bench_args="${ZOO_GPU_BENCH_ARGS:-$DRY_BENCH_ARGS}"
    budget="${ZOO_GPU_BUDGET_S:-420}"
    ZOO_GPU_ROW_MIN_S="${ZOO_GPU_ROW_MIN_S:-10}"
else
    presets="${ZOO_GPU_PRESETS:-$GPU_PRESETS}"
    bench_args="${ZOO_GPU_BENCH_ARGS:-$GPU_BENCH_ARGS}"
    budget="${ZOO_GPU_BUDGET_S:-520}"
fi
row_limit="${ZOO_GPU_ROW_S:-200}"
# a bench row given less than this is skipped rather than started and killed
row_min="${ZOO_GPU_ROW_MIN_S:-60}"
reserve=20  # seconds kept for the closing table
started=$SECONDS

# step NAME LIMIT COMMAND...: run with a time limit cut to what the budget has left (skipped
# when that is under $step_min seconds); log the output to logs/NAME.log, its tail to the
# console, and the outcome to steps.tsv.
step() {
    local name="$1" limit="$2"
    shift 2
    local left=$((budget - reserve - (SECONDS - started)))
    if [ "$left" -lt "$limit" ]; then limit="$left"; fi
    if [ "$limit" -lt "${step_min:-5}" ]; then
        printf '%s\tskipped\t0\tout of time (budget %s s)\n' "$name" "$budget" >> "$results/steps.tsv"
        echo "== $name: skipped, out of time"
        return 124
    fi
    echo "== $name (limit ${limit} s): $*"
    local log="$results/logs/$name.log" begin=$SECONDS status
    timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
    status=$?
    local took=$((SECONDS - begin)) outcome="ok" note=""
    if [ "$status" = 124 ] || [ "$status" = 137 ]; then
        outcome="timeout"; note="killed after ${limit} s"
    elif [ "$status" != 0 ]; then
        outcome="failed"; note="exit $status: $(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-160)"
    fi
    printf '%s\t%s\t%s\t%s\n' "$name" "$outcome" "$took" "$note" >> "$results/steps.tsv"
    tail -n 12 "$log" | sed 's/^/   | /'
    echo "-- $name: $outcome in ${took} s"
    pack
    return "$status"
}

# 1. devices and versions
if command -v nvidia-smi > /dev/null; then
    step nvidia-smi 20 nvidia-smi
fi
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
# one wheel at a time: a wheel that does not fit this Python must not keep the others out
install_wheels() {
    local wheel failed=0
    for wheel in .whl/*.whl; do
        "$PYTHON" -m pip install -q --no-index --no-deps --target .site --upgrade "$wheel" \
            || { echo "gpu.sh: could not install $wheel"; failed=$((failed + 1)); }
    done
    return "$failed"
}
if compgen -G ".whl/*.whl" > /dev/null; then
    export -f install_wheels
    export PYTHON
    step wheels 90 bash -c install_wheels
    [ -d .site ] && export PYTHONPATH=".site:$PYTHONPATH"
fi
step environment 60 "$PYTHON" benchmarks/gpu_suite.py env "$results"

# 2. the GPU correctness tests (pytest's jaxtyping hook needs beartype: drop it if missing)
if [ "${ZOO_GPU_TESTS:-1}" != 0 ]; then
    hook=()
    if ! "$PYTHON" -c "import beartype" 2> /dev/null; then
        echo "gpu.sh: beartype is missing (no .whl/?): tests run without the jaxtyping hook"
        hook=(-o "addopts=-p no:cacheprovider")
    fi
    step pytest-gpu 120 "$PYTHON" -m pytest "${hook[@]}" tests/gpu -m gpu -q -rs \
        --junitxml="$results/pytest-gpu.xml"
fi

# 3. zoo bench, one process per row (each row owns its peak memory; a crash costs one row)
step presets 60 "$PYTHON" -m zoo presets --json
touch "$results/logs/presets.log"
grep "^{" "$results/logs/presets.log" > "$results/presets.jsonl"
step_min="$row_min"
# a preset is skipped when the list was read and lacks it (zoo bench explains otherwise)
known() { [ ! -s "$results/presets.jsonl" ] || grep -q "\"name\": \"$1\"" "$results/presets.jsonl"; }
# nanoGPT's bench.py (GPT-2 124M, torch.compile, bf16 autocast, fused AdamW) at BATCH x SEQ:
# it needs CUDA, and prints "time per iteration: X ms" (gpu_suite.py reads it from the log).
nanogpt_dir() {
    local dir
    for dir in "${ZOO_NANOGPT:-}" .peers/nanogpt ../shared/peers/nanogpt; do
        [ -n "$dir" ] && [ -f "$dir/bench.py" ] && { (cd "$dir" && pwd); return 0; }
    done
    return 1
}
run_nanogpt() {
    local batch="$1" seq="$2" name="nanogpt-${1}x$2" dir
    if ! dir="$(nanogpt_dir)"; then
        printf '%s\tskipped\t0\tnanoGPT not found: set ZOO_NANOGPT or copy it to .peers/nanogpt\n' \
            "$name" >> "$results/steps.tsv"
        echo "== $name: skipped, nanoGPT not found"
        return 0
    fi
    if ! "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2> /dev/null; then
        printf '%s\tskipped\t0\tnanoGPT bench.py needs torch with a CUDA GPU\n' "$name" \
            >> "$results/steps.tsv"
        echo "== $name: skipped, no CUDA GPU for torch"
        return 0
    fi
    step "$name" "$row_limit" bash -c "cd '$dir' && exec '$PYTHON' bench.py --real_data=False \
        --batch_size=$batch --block_size=$seq --compile=True"
}
# LoRA fine-tuning, zoo's `zoo train --lora` against TRL's SFTTrainer in one call
# (benchmarks/finetune_peer.py; random weights unless the row names none: this machine has no
# network to fetch the real checkpoint), speed and memory only
finetune_data() {
    local dir
    for dir in "${ZOO_GPU_DATA:-}" .gpu-data/rotten_tomatoes ../shared/data/rotten_tomatoes; do
        [ -n "$dir" ] && [ -f "$dir/train.jsonl" ] && { (cd "$dir" && pwd); return 0; }
    done
    return 1
}
run_finetune() {
    local batch="$1" seq="$2" name="finetune-${1}x$2" data
    shift 2
    if ! data="$(finetune_data)"; then
        printf '%s\tskipped\t0\tno rotten_tomatoes data: set ZOO_GPU_DATA or copy it to .gpu-data\n' \
            "$name" >> "$results/steps.tsv"
        echo "== $name: skipped, no data"
        return 0
    fi
    step "$name" "$row_limit" "$PYTHON" benchmarks/finetune_peer.py --batch "$batch" \
        --max-len "$seq" --eval 0 --data "$data" --results "$results" "$@"
}
# without_peer WORDS...: the words less the peer's options (--peer NAME, --peer-compile,
# --sequential), into the array `alone`
without_peer() {
    alone=()
    local skip=0 word
    for word in "$@"; do
        if [ "$skip" = 1 ]; then skip=0; continue; fi
        case "$word" in
            --peer) skip=1 ;;
            --peer-compile|--sequential) ;;
            *) alone+=("$word") ;;
        esac
    done
}
while IFS= read -r line; do
    read -r -a words <<< "$line"
    [ "${#words[@]}" -eq 0 ] && continue
    preset="${words[0]}" batch="${words[1]:-}" seq="${words[2]:-}" extra=("${words[@]:3}")
    extra=("${extra[@]/#PROFILE/$results/profile}")
    if [ "$preset" = nanogpt ]; then
        run_nanogpt "$batch" "$seq"
        continue
    fi
    if [ "$preset" = finetune ]; then
        run_finetune "$batch" "$seq" "${extra[@]}"
        continue
    fi
    # --profile DIR comes out of the timed row: the profile is its own short call (below)
    timed=() profile_dir="" skip=0
    for word in "${extra[@]}"; do
        if [ "$skip" = 1 ]; then profile_dir="$word"; skip=0; continue; fi
        if [ "$word" = --profile ]; then skip=1; continue; fi
        timed+=("$word")
    done
    extra=("${timed[@]}")
    name="bench-$preset-${batch}x$seq"
    if ! known "$preset"; then
        printf '%s\tskipped\t0\tpreset %s is not in zoo presets\n' "$name" "$preset" >> "$results/steps.tsv"
        echo "== $name: skipped, zoo presets does not list $preset"
        continue
    fi
    # shellcheck disable=SC2086  # bench_args is a list of options
    step "$name" "$row_limit" "$PYTHON" -m zoo bench --preset "$preset" --batch "$batch" \
        --seq "$seq" $bench_args "${extra[@]}" --out "$results"
    status=$?
    # a peer that cannot run this preset must not cost zoo's numbers: again, zoo alone
    if [ "$status" != 0 ] && [ "$status" != 124 ] && [ "$status" != 137 ] \
        && [[ " ${extra[*]} " == *" --peer "* ]]; then
        without_peer "${extra[@]}"
        # shellcheck disable=SC2086
        step "$name-alone" "$row_limit" "$PYTHON" -m zoo bench --preset "$preset" \
            --batch "$batch" --seq "$seq" $bench_args "${alone[@]}" --out "$results"
    fi
    # the profile: zoo alone, a few traced steps, its JSON row kept in the profile folder. On
    # a GPU XLA runs a step's kernels as CUDA graphs (command buffers), which a trace shows as
    # one op each; the profile call turns them off so that every kernel shows by name.
    if [ -n "$profile_dir" ]; then
        flags="${XLA_FLAGS:-}"
        [ "$dry_run" = 1 ] || flags="${flags:+$flags }--xla_gpu_enable_command_buffer="
        without_peer "${extra[@]}"
        # shellcheck disable=SC2086
        step "profile-$preset-${batch}x$seq" "$row_limit" env XLA_FLAGS="$flags" "$PYTHON" \
            -m zoo bench --preset "$preset" --batch "$batch" --seq "$seq" $bench_args \
            "${alone[@]}" --steps 3 --warmup 1 --rounds 1 --decode-tokens 0 \
            --profile "$profile_dir" --out "$profile_dir"
    fi
done <<< "$(printf '%s\n' "$presets" | tr ';' '\n')"

# 4. the closing table: steps, targets, every row
echo
"$PYTHON" benchmarks/gpu_suite.py summary "$results"
pack
echo "gpu.sh: $((SECONDS - started)) s; results in $results${archive:+, packed in $archive}"

#!/usr/bin/env bash
# Issue 52's measurements in one lent device window (an H100/H200; 15 minutes of device time, start included).
#
# Here, before asking for the machine (builds .device/, git-ignored: the wheels the device image lacks and the data
# and tokenizers the bench reads; about 16 MiB; then runs the train section's paths on this CPU at a toy size, ~2.5
# minutes, and stops if they fail, so that a window measures instead of debugging):
#   bash bench/device_session.sh prepare
# Then one call of the device tool's run:
#   command: bash bench/device_session.sh measure    carry: [".device"]    timeout_s: 560
# and give the machine back unless rerunning at once. Logs land in $OUT (train-default.log with the card,
# trace-summary.log, PromptBERT's and CoT-BERT's gzipped traces, train-loop-small-calls.log, train-no-triton-gemm.log,
# train-unroll4.log, sts.log with bench/attention.py's table: the 8 files a call brings back at most): the default
# step (encoder calls stacked; on a GPU the layers unrolled since 2026-11-30: docs/benchmarks.md, "The unrolled step
# on a GPU") with where its GPU time goes, two ways to a shorter first step (the small calls in the scan's loop; no
# Triton gemms), PromptBERT with four layers a trip (issue 52's partial unrolls), the cold and warm 7-task STS
# evaluation, and the encoder's attention against cuDNN's fused kernel. Each bench run is capped so that a hang
# cannot take the window.
# Issue 53's embedding bench (bench/embed.py against sentence-transformers on the GPU) is a second call, made at once
# while the machine is warm if the window has ~4 minutes left (it runs ~3-4: the bench, embed.py with fewer bucket
# widths merged, a host profile of embed.py):
#   command: bash bench/device_session.sh measure-embed    carry: [".device"]    timeout_s: 360
# MiniLM's weights (90 MB) are over what a call carries, so it writes a model of MiniLM's shape with random weights
# there (the throughput is the shape's) beside MiniLM's own tokenizer and sentence-transformers modules, and embeds
# the wiki sample ten times over, each copy's lines numbered apart (119,140 distinct sentences: the Encoder embeds
# a repeated sentence once), so that the compiles do not fill the measurement. Log: $OUT/embed.log.
set -uo pipefail
cd "$(dirname "$0")/.."

prepare() {
  rm -rf .device && mkdir -p .device/wheels .device/shared/data/senteval .device/shared/data/wiki
  # The device image has jax, flax, optax, orbax, transformers, torch, pyarrow, pandas (its Python is 3.12):
  # datasets and its own two, and ml_collections are what it lacks.
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 -d .device/wheels \
    datasets dill multiprocess ml_collections
  cp -r ../shared/tokenizers .device/shared/
  cp -r ../shared/data/senteval/STS ../shared/data/senteval/SICK .device/shared/data/senteval/
  cp ../shared/data/wiki/wiki1m_sample.txt .device/shared/data/wiki/
  (cd ../shared/models/all-MiniLM-L6-v2 && find . -type f ! -name '*.safetensors' ! -name '*.bin' ! -name README.md \
    -exec install -D -m 644 {} "$OLDPWD/.device/minilm-shaped/{}" \;)
  du -sh .device
  smoke
}

smoke() {
  # MiniLM, batch 16: the three settings' jaxemb steps with the paths `measure` takes on a GPU (the encoder calls
  # stacked, the small ones looped) and their traces read as there; the authors' fp16 step takes minutes a step on a
  # CPU, so it is left out.
  local trace
  trace=$(mktemp -d)
  timeout 600 python3 bench/accelerator.py --train-model minilm --train-batch 16 --train-tokens 16 --sections train \
    --settings promptbert,simcse,cotbert --repeats 1 --dtype float32 --no-authors --trace "$trace" \
    --set model.stack_encoder_calls=True --set model.loop_small_calls=True \
    && python3 bench/trace_summary.py "$trace"/* --top 3 > /dev/null && echo "smoke run on the CPU: ok" \
    || { echo "smoke run on the CPU failed: fix it before asking for the device" >&2; rm -rf "$trace"; return 1; }
  rm -rf "$trace"
}

setup() {
  : "${OUT:?set by the device tool}"
  python3 -m pip install --quiet --no-index --no-deps .device/wheels/*.whl 2>&1 | tail -3
  export JAXEMB_SHARED="$PWD/.device/shared" PYTHONUNBUFFERED=1
}

measure() {
  setup
  # The card and versions head the first log: $OUT brings back 8 files at most.
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/train-default.log"
  python3 -c "import jax, flax, torch; print('jax', jax.__version__, 'flax', flax.__version__, 'torch', torch.__version__, jax.devices())" | tee -a "$OUT/train-default.log"
  local bench=(python3 bench/accelerator.py --models bert-base --repeats 5)
  timeout 220 "${bench[@]}" --sections train --trace /tmp/trace 2>&1 | tee -a "$OUT/train-default.log"
  # Where the default step's GPU time goes (two steps per setting under the profiler), read there and brought back.
  python3 bench/trace_summary.py /tmp/trace/* --top 25 2>&1 | tee "$OUT/trace-summary.log"
  for trace in /tmp/trace/promptbert /tmp/trace/cotbert; do  # SimCSE's is in the summary: 8 files come back at most.
    [ -d "$trace" ] || continue
    find "$trace" -name '*.xplane.pb' -exec gzip -c {} \; > "$OUT/trace-$(basename "$trace").xplane.pb.gz"
  done
  # The first step over issue 52's 45 s (PromptBERT 48 s, CoT-BERT 59 s unrolled, 2026-11-30): the bias tables'
  # small calls in the scan's loop (one layer compiled, not twelve); PromptBERT without XLA's Triton gemm fusions,
  # whose autotuning compiles many kernels a dot (cuBLAS alone).
  timeout 110 "${bench[@]}" --sections train --settings promptbert,cotbert --set model.loop_small_calls=True 2>&1 \
    | tee "$OUT/train-loop-small-calls.log"
  XLA_FLAGS=--xla_gpu_enable_triton_gemm=false timeout 65 "${bench[@]}" --sections train --settings promptbert \
    2>&1 | tee "$OUT/train-no-triton-gemm.log"
  timeout 60 "${bench[@]}" --sections train --settings promptbert --set model.scan_unroll=4 2>&1 \
    | tee "$OUT/train-unroll4.log"
  timeout 40 "${bench[@]}" --sections sts 2>&1 | tee "$OUT/sts.log"
  # Issue 52 item 3: the encoder's attention (XLA's) against cuDNN's fused kernel, bf16 (in sts.log: 8 files at most).
  timeout 25 python3 bench/attention.py 2>&1 | tee -a "$OUT/sts.log"
}

measure_embed() {
  setup
  local model=.device/minilm-shaped corpus=.device/wiki-x10.txt
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/embed.log"
  python3 -c "import sys, transformers as t; t.BertModel(t.BertConfig.from_pretrained(sys.argv[1])).save_pretrained(sys.argv[1])" \
    "$model" 2>&1 | tail -3
  awk '{for (copy = 0; copy < 10; copy++) print copy ": " $0}' .device/shared/data/wiki/wiki1m_sample.txt > "$corpus"
  timeout 150 python3 bench/embed.py --device cuda --model "$model" --corpus "$corpus" --batch_size 256 --repeats 2 \
    2>&1 | tee -a "$OUT/embed.log"
  # The GPU's eval.compile_flops (1e15: a bert-base shape's ~5 s of compiling and autotuning) merges this corpus's 23
  # bucket widths into one, 144 tokens: 5.2x the FLOPs each width its own would run (7.3e13). Each width its own
  # (0) and two widths (1e14: 44 and 144, 1.9x), each run twice: cold, then with the compilation cache warm.
  local flops run
  for flops in 0 1e14; do
    for run in cold warm; do
      echo "eval.compile_flops=$flops, $run:" | tee -a "$OUT/embed.log"
      timeout 35 python3 embed.py --config configs/embed.py --config.model.path="$model" --config.method.name=last_avg \
        --config.embed.corpus="$corpus" --config.embed.output="/tmp/embed-$flops-$run" --config.embed.normalize=True \
        --config.eval.batch_size=256 --config.eval.progress=False --config.eval.compile_flops="$flops" 2>&1 \
        | tail -1 | tee -a "$OUT/embed.log"
    done
  done
  # Where embed.py's time goes on the host (on the H200 it ran at the rate a 1-layer model gets on a 2-core CPU):
  # once more under cProfile, compiles cached by the bench's runs, the 30 longest functions by their own time.
  timeout 45 python3 -m cProfile -o /tmp/embed.prof embed.py --config configs/embed.py --config.model.path="$model" \
    --config.embed.corpus="$corpus" --config.embed.output=/tmp/embed-profiled --config.eval.batch_size=256 2>&1 \
    | tail -2 | tee -a "$OUT/embed.log"
  python3 -c "import pstats; pstats.Stats('/tmp/embed.prof').sort_stats('tottime').print_stats(30)" \
    | tee -a "$OUT/embed.log"
}

case "${1:-}" in
  prepare) prepare ;;
  measure) measure ;;
  measure-embed) measure_embed ;;
  *) echo "usage: bash bench/device_session.sh prepare|measure|measure-embed" >&2; exit 2 ;;
esac

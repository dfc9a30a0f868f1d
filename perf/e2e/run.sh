#!/usr/bin/env bash
# One-shot GPU end-to-end check and benchmark of liboscar's GPU engine
# (engine/gpu), for the H200 device machine. Builds (CUDA on, HIP/OpenCL
# off), runs the real-weight agreement checks on tiny-qwen3 against the CPU
# engine, then the Qwen3-8B-shaped random-weight benchmark (BF16 vs oscar2
# under one KV budget, batch 1 at long context), and prints a Markdown
# table last (also written to $OUT/e2e.md, the full log to $OUT/e2e.log).
#
#   perf/e2e/run.sh [--carry DIR] [--model DIR|TAR] [--tokens FILE] [--deps TAR] [--set all|new]
#                   [--budget-gb G] [--prompt P] [--gen N] [--no-check] [--no-bench] [--debug-layers]
#                   [--breakdown] [--calib-tokens FILE] [--wide-params FILE]
# --set new: only the checks and benchmark rows added for chunked prefill,
# shared prefixes and feedback weights (issues 13, 14), with the BF16 and
# nearest-rounding rows they are compared with: fits one device call.
# --debug-layers: before the checks, oscar-gpu-generate --debug-layers (device
# weights vs host, then each prefill stage vs the CPU engine; fp32 and bf16).
# --breakdown: after the benchmark (or alone, with --no-check --no-bench), the per-phase
# breakdown of one decode step (oscar-e2e-bench --breakdown: CUDA events between the phases of
# the forward step, medians of 10 rounds; engine/gpu/README.md) for Qwen3-8B at the largest
# P+N batch and at batch 1 x 32K (bf16, oscar2 with feedback weights), and Qwen3-32B at batch
# 1 x 32K (oscar2 with feedback weights, then bf16); tables into e2e.md, each run's tuned weight products
# (--gemm-report: cuBLAS default, chosen and the engine's own GEMM per product, us) into e2e.log.
# --carry DIR: the folder perf/e2e/pack.sh made (deps.tar.xz, tiny-qwen3.tar.xz,
# eval-head.tokens, calib-head.tokens); explicit --model/--tokens/--deps/--calib-tokens override it.
# --calib-tokens FILE: calibration tokens (uint32) for the wide-pages checks' parameter file, calibrated
# here on the CPU (oscar-calibrate --wide-bits 0.05, first 32768 tokens); --wide-params FILE: use that
# parameter file instead (it must hold 3-bit head-tensors).
# Tolerances of the checks (oscar-gpu-generate --check, teacher forcing over
# the GPU's 64 greedy tokens from a 1024-token prompt of eval.tokens; a
# disagreement is a near tie when the CPU's margin is below 0.1 (fp32
# weights/activations) or 0.5 (bf16) and within twice that step's logit
# difference). Set so that numeric noise passes and a real bug
# (wrong rows, wrong positions, wrong scale: logit differences of whole
# units, agreement far below 90%) fails:
#   bf16 KV, fp32 weights/activations : every step agrees (near ties excepted), max logit diff <= 0.25 (first 16)
#   bf16 KV, bf16 weights/activations : >= 90% agree, max logit diff <= 1.5 (first 16)
#   oscar2 / int2, fp32, stepwise     : vs CPU engine + fakequant hook: >= 90% agree, max logit diff <= 1.0 (first 16)
#   oscar2, bf16, exact prefill       : looser (>= 75%, <= 3.0): the prompt's own attention is exact here
#                                       while the CPU hook quantizes it
#   batched (7 requests through 3 slots) vs each request alone, fp32: identical tokens up to near ties,
#                                       logit diff <= 0.05 (bf16 KV) / 0.5 (oscar2: a GEMM rounding
#                                       difference can flip a 2-bit code)
# Chunked prefill (--chunk C: each chunk appended, then oscar_extend over the whole cache) against the
# CPU engine with the same schedule (chunk_tokens C up to the prompt's end, token by token after; the
# engine clamps C to the recent window W = 256 for 2-bit methods, so --chunk 512 runs 256 and says so):
#   bf16 KV, fp32, chunk 512          : as exact fp32: every step agrees (near ties excepted), <= 0.25
#   oscar2, fp32, chunk 512 (-> 256)  : as stepwise: >= 90% agree, <= 1.0 (the CPU hook sees the same
#                                       2-bit rows at every query: the schedule is the GPU's)
#   oscar2, bf16, chunk 128           : >= 85% agree, <= 2.0 (bf16 weight noise moves 2-bit codes; the
#                                       exact-prefill row above needs 0.75 / 3.0 with a schedule mismatch)
# Shared prefix (--shared-prefix 480 4 3: 4 requests of 480 shared + 544 own tokens, 3 slots, the
# prefix's full pages referenced by every block table, its window and its half-written last page
# copied: 480 - S0 - W = 160 2-bit rows = 2.5 pages), each request vs the CPU engine run on its
# whole prompt with the same chunks (chunk 96 divides the prefix):
#   bf16 KV, fp32                     : every step agrees (near ties excepted), <= 0.25
#   oscar2, fp32                      : >= 90% agree, <= 1.0
# A wrong page in a block table, a window row not copied or a chunk attending to the wrong rows moves
# logits by whole units and agreement far below 90%: these fail.
# Per-layer pages (issue 16): a parameter file calibrated with --wide-bits 0.05 (3-bit head-tensors in
# some layers; the engine sets layout.wide_per_layer and sizes each layer's pool with its own page),
# the GPU against the CPU engine with the same file (its fakequant hook stores those head-tensors in
# 3 bits too), with the tolerances of the 2-bit rows above: stepwise, chunk 512 (-> 256), batched (7
# requests through 3 slots: pages reused across the layers' pools of different page sizes), shared
# prefix (the fork copies each layer's partly written page at that layer's page size), bf16 chunk 128.
# Each such check also fails unless the engine says it runs per-layer pages ("kv: per-layer pages").
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/e2e-out}
mkdir -p "$out"
log=$out/e2e.log
exec > >(tee "$log") 2>&1
carry= model= tokens= deps= calib_tokens= wide_params= budget=40 prompt=8192 gen=1024 do_check=1 do_bench=1 do_debug=0 set=all do_breakdown=0
bench_limit=${E2E_BENCH_LIMIT:-530}  # seconds from the start after which no new benchmark run starts (+30 s at most: one 600 s device call)
while (($#)); do
  case $1 in
    --carry) carry=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --deps) deps=$2; shift 2 ;;
    --calib-tokens) calib_tokens=$2; shift 2 ;;
    --wide-params) wide_params=$2; shift 2 ;;
    --budget-gb) budget=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --no-check) do_check=0; shift ;;
    --no-bench) do_bench=0; shift ;;
    --debug-layers) do_debug=1; shift ;;
    --breakdown) do_breakdown=1; shift ;;
    --set) set=$2; shift 2
      [[ $set == all || $set == new ]] || { echo "run.sh: --set takes all or new, not $set"; exit 2; } ;;
    *) echo "run.sh: unknown option $1"; exit 2 ;;
  esac
done
if [[ -n $carry ]]; then
  [[ -z $model && -e $carry/tiny-qwen3.tar.xz ]] && model=$carry/tiny-qwen3.tar.xz
  [[ -z $tokens && -e $carry/eval-head.tokens ]] && tokens=$carry/eval-head.tokens
  [[ -z $deps && -e $carry/deps.tar.xz ]] && deps=$carry/deps.tar.xz
  [[ -z $calib_tokens && -e $carry/calib-head.tokens ]] && calib_tokens=$carry/calib-head.tokens
fi
t_start=$(date +%s)
# Qwen3-32B's 64 GB of bf16 weights beside the KV budget: on a card too small for both (an 80 GB H100
# at 40 GB) its rows take what the card leaves (less 8 GB for activations and workspace), labelled in
# the tables, instead of failing; the 8B rows keep the budget asked for.
budget32=$budget
total_gb=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | awk '{printf "%d", $1 * 1.048576 / 1000}')
if [[ -n $total_gb ]] && (( total_gb > 0 && total_gb - 72 < ${budget%.*} )); then
  budget32=$(( total_gb - 72 > 1 ? total_gb - 72 : 1 ))
fi
echo "== e2e: $(date -u +%FT%TZ), $(nvidia-smi -L 2>/dev/null | head -1 || echo 'no nvidia-smi')"

# ------------------------------------------------------------- dependencies
have_deps() { pkg-config --exists jansson 2>/dev/null && ldconfig -p | grep -q liblapacke && ldconfig -p | grep -q libopenblas; }
# A stand-in pkg-config that knows only the unpacked jansson, for an image without pkg-config.
pkgconfig_shim() {
  mkdir -p /tmp/e2e-deps/bin
  cat >/tmp/e2e-deps/bin/pkg-config <<'SHIM'
#!/bin/sh
p=/tmp/e2e-deps; out=""; mod=""
for a in "$@"; do case $a in --*) ;; *) mod=$a ;; esac; done
for a in "$@"; do
  case $a in
    --version) echo 0.29.2; exit 0 ;;
    --exists|--print-errors|--short-errors|--static) ;;
    --modversion) out="$out 2.14" ;;
    --variable=prefix) out="$out $p" ;;
    --variable=includedir) out="$out $p/include" ;;
    --variable=libdir) out="$out $p/lib" ;;
    --variable=*) ;;
    --cflags|--cflags-only-I) out="$out -I$p/include" ;;
    --libs) out="$out -L$p/lib -ljansson" ;;
    --libs-only-L) out="$out -L$p/lib" ;;
    --libs-only-l) out="$out -ljansson" ;;
    --*) ;;
  esac
done
[ "$mod" = jansson ] || [ -z "$mod" ] || exit 1
[ -n "$out" ] && echo $out
exit 0
SHIM
  chmod +x /tmp/e2e-deps/bin/pkg-config
  export PATH=/tmp/e2e-deps/bin:$PATH
  echo "deps: no pkg-config on this machine; using a stand-in for jansson"
}
if ! have_deps; then
  if [[ -z $deps ]]; then
    echo "run.sh: jansson / LAPACKE / OpenBLAS missing and no --deps given; make them with perf/e2e/pack.sh"; exit 1
  fi
  mkdir -p /tmp/e2e-deps && tar -C /tmp/e2e-deps -xJf "$deps" || { echo "run.sh: cannot unpack $deps"; exit 1; }
  export PKG_CONFIG_PATH=/tmp/e2e-deps/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export CMAKE_PREFIX_PATH=/tmp/e2e-deps${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export LD_LIBRARY_PATH=/tmp/e2e-deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LIBRARY_PATH=/tmp/e2e-deps/lib CPATH=/tmp/e2e-deps/include
  echo "deps: unpacked $deps into /tmp/e2e-deps"
  command -v pkg-config >/dev/null || pkgconfig_shim
fi
if [[ -n $model && $model == *.tar.xz ]]; then
  mkdir -p /tmp/e2e-model && tar -C /tmp/e2e-model -xJf "$model" || { echo "run.sh: cannot unpack $model"; exit 1; }
  model=/tmp/e2e-model/tiny-qwen3
fi

# -------------------------------------------------------------------- build
build=$root/build-e2e-dev
gen_flag=()
command -v ninja >/dev/null && gen_flag=(-G Ninja)
[[ -f $build/CMakeCache.txt ]] && gen_flag=()
# The CUDA plugin's kernels are generated with jinja2: use a python3 that has it.
py=()
for cand in "$(command -v python3)" /usr/bin/python3 /opt/torch/.venv/bin/python3; do
  if [[ -x $cand ]] && "$cand" -c 'import jinja2' 2>/dev/null; then py=(-DPython3_EXECUTABLE="$cand"); break; fi
done
((${#py[@]})) || echo "run.sh: warning: no python3 with jinja2 found; the CUDA plugin's code generation will fail"
echo "== build ($build)"
if ! cmake -S "$root" -B "$build" "${gen_flag[@]}" -DCMAKE_BUILD_TYPE=Release -DOSCAR_WERROR=OFF -DOSCAR_CUDA=ON -DOSCAR_HIP=OFF \
      -DOSCAR_OPENCL=OFF -DOSCAR_BUILD_TESTS=OFF -DOSCAR_GEN_SET=minimal "-DOSCAR_CUDA_ARCHS=90a-real;90-virtual" "${py[@]}" >"$out/cmake.txt" 2>&1; then
  tail -40 "$out/cmake.txt"; echo "run.sh: configure failed"; exit 1
fi
grep -E "liboscar:" "$out/cmake.txt"
if ! cmake --build "$build" -j"$(nproc)" --target oscar-gpu-generate oscar-e2e-bench oscar-gpu-selftest oscar_backend_cuda oscar-calibrate \
      >"$out/build.txt" 2>&1; then
  grep -E "error|Error" "$out/build.txt" | head -40; echo "run.sh: build failed"; exit 1
fi
echo "build: done in $(( $(date +%s) - t_start )) s"
export OSCAR_PLUGIN_PATH=$build/lib
bin=$build/bin
md=$out/e2e.md
: >"$md"

# ------------------------------------------------------------------ checks
checks_ok=1
echo "== kernel self-test"
timeout 120 "$bin/oscar-gpu-selftest" || checks_ok=0
if ((do_debug)) && [[ -n $model && -n $tokens ]]; then
  for prec in --fp32 ""; do
    echo "== layer-by-layer diagnostic ${prec:-bf16}"
    timeout 120 "$bin/oscar-gpu-generate" "$model" --prompt-tokens "$tokens" --prompt-len 1024 --debug-layers $prec 2>&1 |
      sed 's/^/  /' || checks_ok=0
  done
fi
if ((do_check)); then
  if [[ -z $model || -z $tokens ]]; then
    echo "== checks skipped: give --model and --tokens (or --carry)"; checks_ok=0
  else
    echo "== agreement checks on $model"
    {
      echo "### Agreement with the CPU engine (tiny-qwen3, prompt 1024 tokens of eval.tokens, 64 greedy steps)"
      echo
      echo "| KV method | weights/act | prefill | exact agree | near ties | rate | max logit diff (first 16) | max logit diff (all) | result |"
      echo "|---|---|---|---|---|---|---|---|---|"
    } >>"$md"
    run_check() { # method fp32|bf16 stepwise|exact|batched|chunk:C|shared:C min_agree max_diff [wide params file]
      local args=(--method "$1" --prompt-len 1024 --n 64 --check --min-agree "$4" --max-logit-diff "$5" --first 16)
      [[ $3 == batched ]] && args=(--method "$1" --prompt-len 300 --n 32 --batch-check 7 3 --max-logit-diff "$5")
      [[ $3 == chunk:* ]] && args+=(--chunk "${3#chunk:}")
      [[ $3 == shared:* ]] && args+=(--chunk "${3#shared:}" --shared-prefix 480 4 3)
      [[ $2 == fp32 ]] && args+=(--fp32)
      [[ $3 == stepwise ]] && args+=(--stepwise)
      local label=$1 wide=${6:-}
      [[ -n $wide ]] && { args+=(--params "$wide"); label="$1, --wide-bits 0.05 file"; }
      local o
      o=$(timeout 180 "$bin/oscar-gpu-generate" "$model" --prompt-tokens "$tokens" "${args[@]}" 2>&1)
      local rc=$? flat=0
      echo "$o" | grep -vE "^tokens:" | sed 's/^/  /'
      # A wide file must be served with per-layer pages (oscar-gpu-generate prints them).
      if [[ -n $wide ]] && ! grep -q '^kv: per-layer pages' <<<"$o"; then
        echo "  wide check: the engine did not report per-layer pages for $wide: FAIL"
        flat=1
        ((rc == 0)) && rc=4
      fi
      local line
      line=$(echo "$o" | grep '^RESULT|' | tail -1)
      if [[ -n $line ]] && ((!flat)); then
        echo "$line" | awk -F'|' -v lab="$label" '{printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", lab,$3,$4,$5,$6,$7,$8,$9,$10}' >>"$md"
      else
        echo "| $label | $2 | $3 | - | - | - | - | - | ERROR (rc $rc) |" >>"$md"
      fi
      ((rc == 0)) || checks_ok=0
    }
    if [[ $set == all ]]; then
      run_check bf16 fp32 exact 1.0 0.25
      run_check bf16 bf16 exact 0.9 1.5
      run_check oscar2 fp32 stepwise 0.9 1.0
      run_check int2 fp32 stepwise 0.9 1.0
      run_check oscar2 bf16 exact 0.75 3.0
      # Batched (7 requests, 3 slots: cu_seqlens prefill, FIFO refill, page reuse) vs each request alone.
      run_check bf16 fp32 batched 1.0 0.05
      run_check oscar2 fp32 batched 1.0 0.5
    fi
    # Chunked prefill through oscar_extend, and a shared prefix (tolerances in the header).
    run_check bf16 fp32 chunk:512 1.0 0.25
    run_check oscar2 fp32 chunk:512 0.9 1.0
    run_check oscar2 bf16 chunk:128 0.85 2.0
    run_check bf16 fp32 shared:96 1.0 0.25
    run_check oscar2 fp32 shared:96 0.9 1.0
    # Per-layer pages: a --wide-bits 0.05 parameter file (tolerances in the header).
    wide=$wide_params
    if [[ -z $wide && -n $calib_tokens ]]; then
      wide=$out/tiny-qwen3.wide-bits-0.05.safetensors
      echo "== calibrating $wide on the CPU (oscar-calibrate --wide-bits 0.05, 32768 tokens of $calib_tokens)"
      timeout 300 "$bin/oscar-calibrate" "$model" --tokens "$calib_tokens" --out "$wide" --max-tokens 32768 \
        --wide-bits 0.05 >"$out/calibrate-wide.txt" 2>&1
      crc=$?
      grep -iE -A12 "code widths" "$out/calibrate-wide.txt" | sed 's/^/  /'
      if ((crc != 0)); then
        tail -20 "$out/calibrate-wide.txt" | sed 's/^/  /'; echo "  calibration failed (rc $crc)"; wide=
      fi
    fi
    if [[ -n $wide && -f $wide ]]; then
      run_check oscar2 fp32 stepwise 0.9 1.0 "$wide"
      run_check oscar2 fp32 chunk:512 0.9 1.0 "$wide"
      run_check oscar2 fp32 batched 1.0 0.5 "$wide"
      run_check oscar2 fp32 shared:96 0.9 1.0 "$wide"
      run_check oscar2 bf16 chunk:128 0.85 2.0 "$wide"
    else
      echo "== wide-pages checks not run: no parameter file (give --calib-tokens or --wide-params, or --carry with calib-head.tokens)"
      echo "| oscar2, --wide-bits 0.05 file | - | - | - | - | - | - | - | NOT RUN (no parameter file) |" >>"$md"
      checks_ok=0
    fi
    echo >>"$md"
  fi
fi

# ---------------------------------------------------------------- benchmark
if ((do_bench)); then
  echo "== benchmark: Qwen3-8B and Qwen3-32B shapes, random bf16 weights"
  {
    echo "### End to end, random bf16 weights, KV budget ${budget} GB"
    echo
    echo "Qwen3-8B: 36 layers, hidden 4096, 32/8 heads, d 128, intermediate 12288. Qwen3-32B: 64 layers, hidden 5120,"
    echo "64/8 heads, d 128, intermediate 25600."
    echo
    echo "| method | run | context | batch | KV bits/elem | generated tok/s | time per output token (ms) | roofline step (ms) | measured / roofline | prefill tok/s | KV GiB | device GiB used |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  } >>"$md"
  bench() { # method budget prompt gen long time_limit wall_limit [extra oscar-e2e-bench options]
    local m=$1 b=$2 p=$3 g=$4 l=$5 t=$6 w=$7
    shift 7
    timeout "$w" "$bin/oscar-e2e-bench" --method "$m" --budget-gb "$b" --prompt "$p" --gen "$g" --long "$l" \
      --long-steps 64 --time-limit "$t" --md "$md" "$@"
  }
  # method | prompt | gen | long contexts | extra options
  # oscar2 runs use synthetic error-feedback weights (--feedback: the write path of the calibrated
  # default, issue 14); the nearest-rounding row stays beside the main one.
  # Chunked prefill of one 8K prompt (--chunk; 2-bit chunks clamped to W = 256), and 16 requests
  # sharing a 4K prefix (--shared-prefix: stored once vs each prefilling its whole prompt).
  new_runs=(  # in priority order: later runs are skipped when time runs out
    "bf16|$prompt|$gen|131072|"
    "oscar2|$prompt|$gen|32768,131072|--feedback"
    "oscar2|$prompt|$gen|131072|"
    "bf16|8192|16||--batch 1 --chunk 512"
    "oscar2|8192|16||--batch 1 --chunk 256 --feedback"
    "oscar2|8192|16||--batch 1 --chunk 256"
    "oscar2|4608|64||--shared-prefix 4096 --requests 16 --suffix 512 --chunk 256 --feedback"
    "bf16|4608|64||--shared-prefix 4096 --requests 16 --suffix 512 --chunk 512"
    "oscar2|8192|16||--batch 1 --chunk 64 --feedback"
  )
  all_runs=(
    "bf16|$prompt|$gen|32768,131072|"
    "oscar2|$prompt|$gen|32768,131072|--feedback"
    "oscar2|$prompt|$gen|32768,131072|"
    "bf16|8192|16||--batch 1 --chunk 512"
    "oscar2|8192|16||--batch 1 --chunk 256 --feedback"
    "oscar2|4608|64||--shared-prefix 4096 --requests 16 --suffix 512 --chunk 256 --feedback"
    "bf16|$prompt|$gen||--shape qwen3-32b"
    "oscar2|$prompt|$gen|131072|--shape qwen3-32b --feedback"
    "bf16|32768|1024||--real-prefill 0"
    "oscar2|32768|1024||--real-prefill 0 --feedback"
    "oscar2|$prompt|$gen|131072|--no-graphs --feedback"
    "bf16|$prompt|$gen|131072|--no-graphs"
    "oscar2|$prompt|$gen||--shape qwen3-32b"
  )
  if [[ $set == new ]]; then runs=("${new_runs[@]}"); else runs=("${all_runs[@]}"); fi
  if [[ $budget32 != "$budget" ]]; then
    echo "Qwen3-32B rows: KV budget ${budget32} GB (a ${total_gb} GB card holds 64 GB of weights beside it), not ${budget} GB." >>"$md"
    echo >>"$md"
  fi
  for r in "${runs[@]}"; do
    IFS='|' read -r m p g l x <<<"$r"
    left=$(( bench_limit - ($(date +%s) - t_start) ))
    if ((left < 60)); then echo "bench $m $p+$g $x skipped: time"; echo "| $m | $p+$g $x: skipped (time) |||||||||||" >>"$md"; continue; fi
    # shellcheck disable=SC2086
    # A run may overrun the limit by 30 s at most, so the whole script stays within one device call.
    wall=$(( left + 30 < 240 ? left + 30 : 240 ))
    b=$budget; [[ $x == *qwen3-32b* ]] && b=$budget32
    bench "$m" "$b" "$p" "$g" "${l:-0}" 12 "$wall" $x || echo "| $m | $p+$g $x: FAILED (see e2e.log) |||||||||||" >>"$md"
  done
  echo >>"$md"
  echo "Generated tok/s: batch x decode steps / decode time (first step excluded); time per output token: median decode step." >>"$md"
  echo "Roofline step: bytes one decode step must read (all weights but the embedding table, plus every sequence's pages and window at its mean length) / device-to-device copy bandwidth measured in the same run." >>"$md"
  echo "Caches beyond the really prefilled sequence are filled with random K/V through oscar_append (decode speed does not depend on the values)." >>"$md"
  echo "Rounding of the 2-bit rows: \"feedback weights\" = built-in oscar2 parameters plus synthetic error-feedback weights (|F| <= 0.2, the cost of the calibrated default's write path; the random-weight model has no calibration), \"nearest rounding\" = the built-in parameters as they are." >>"$md"
  echo "\"prefill in chunks of C\": the real 8K prompt goes through the model C tokens at a time, each chunk appended and attending over the whole cache with oscar_extend (batch 1, 16 decode steps: read the prefill tok/s column; 2-bit chunks are clamped to the recent window 256)." >>"$md"
  echo "Shared-prefix rows: 16 requests of 4096 common + 512 own random tokens, 64 generated each, 17 slots, chunked prefill; prefill tok/s = all 16 x 4608 prompt tokens served / prefill time (the prefix computed once when stored once); KV GiB = the pages and windows the requests hold (the prefix's full pages once when shared); decode columns from the same run." >>"$md"
fi

# ---------------------------------------------------------- step breakdown
if ((do_breakdown)); then
  echo "== decode step breakdown (oscar-e2e-bench --breakdown)"
  {
    echo "### Decode step breakdown, random bf16 weights, KV budget ${budget} GB"
    echo
    echo "One decode step cut into the phases of the engine's forward step (CUDA events between phases, host launches),"
    echo "summed over layers; medians of 10 rounds after 3 warm-up steps. Beside it the same step replayed from its CUDA"
    echo "graph (the normal path) and the roofline step. GB/s: the weight bytes a GEMM reads (the KV bytes for attention)"
    echo "over its time; of copy BW: that over the device-to-device copy bandwidth (read + written) measured in the same run."
  } >>"$md"
  # method | extra options: the largest $prompt+$gen batch unless --no-throughput, then batch 1 at each --long.
  bd_runs=(
    "oscar2|--long 32768 --feedback"
    "bf16|--long 32768"
    "oscar2|--long 32768 --shape qwen3-32b --no-throughput --feedback"
    "bf16|--long 32768 --shape qwen3-32b --no-throughput"
  )
  for r in "${bd_runs[@]}"; do
    IFS='|' read -r m x <<<"$r"
    left=$(( bench_limit - ($(date +%s) - t_start) ))
    if ((left < 60)); then echo "breakdown $m $x skipped: time"; echo >>"$md"; echo "Breakdown $m $x: skipped (time)." >>"$md"; continue; fi
    wall=$(( left + 30 < 240 ? left + 30 : 240 ))
    # shellcheck disable=SC2086
    b=$budget; [[ $x == *qwen3-32b* ]] && b=$budget32
    timeout "$wall" "$bin/oscar-e2e-bench" --method "$m" --budget-gb "$b" --prompt "$prompt" --gen "$gen" \
      --breakdown --breakdown-steps 10 --breakdown-warmup 3 --gemm-report --md "$md" $x ||
      { echo >>"$md"; echo "Breakdown $m $x: FAILED (see e2e.log)." >>"$md"; }
  done
  echo >>"$md"
fi

echo
echo "== summary ($(( $(date +%s) - t_start )) s)"
cat "$md"
((checks_ok)) || { echo "run.sh: some checks FAILED or did not run"; exit 3; }

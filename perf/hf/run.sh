#!/usr/bin/env bash
# transformers + liboscar on the H200 device machine, one shot: installs the
# Python package the way the lead does, builds the project's GPU engine (for
# its greedy tokens, in the background meanwhile), then perf/hf/bench.py:
# agreement (greedy tokens/logits vs transformers' default cache and the GPU
# engine; teacher-forced ppl/KL/top-1 vs oscar-eval's figures) and decode
# speed (OscarCache vs DynamicCache, StaticCache and, where importable,
# QuantizedCache) at batch {1,8,32} x context {4K,32K}. Writes the report to
# $OUT/RESULTS.md (copy it to perf/hf/RESULTS.md) and the log to $OUT/hf.log.
#
#   perf/hf/run.sh [--carry DIR] [--model DIR|TAR] [--tokens FILE] [--no-engine] [--pytest] [--limit S]
# --carry DIR: the folder perf/hf/pack.sh makes (perf/e2e/pack.sh's
#   tiny-qwen3.tar.xz, eval-head.tokens, deps.tar.xz: the GPU engine needs
#   jansson/OpenBLAS; and wheels/ with optimum-quanto for QuantizedCache).
# --no-engine: skip the GPU engine (no deps, or to save ~1 min).
# --pytest: also run pytest python/tests (CUDA tests and the CPU HF tests).
# --limit S: wall-clock budget of the whole script (default 230 s); the
#   speed points left when it runs out are marked "skipped (time)".
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/hf-out}
mkdir -p "$out"
exec > >(tee "$out/hf.log") 2>&1
carry= model= tokens= engine=1 do_pytest=0 limit=230
while (($#)); do
  case $1 in
    --carry) carry=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --no-engine) engine=0; shift ;;
    --pytest) do_pytest=1; shift ;;
    --limit) limit=$2; shift 2 ;;
    *) echo "run.sh: unknown option $1"; exit 2 ;;
  esac
done
t0=$(date +%s)
# absolute paths: the script changes directory below
abs() { [[ -e $1 ]] && echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")" || echo "$1"; }
[[ -n $carry ]] && carry=$(abs "$carry")
[[ -n $model ]] && model=$(abs "$model")
[[ -n $tokens ]] && tokens=$(abs "$tokens")
left() { echo $((limit - ($(date +%s) - t0))); }
if [[ -n $carry ]]; then
  [[ -z $model && -e $carry/tiny-qwen3.tar.xz ]] && model=$carry/tiny-qwen3.tar.xz
  [[ -z $tokens && -e $carry/eval-head.tokens ]] && tokens=$carry/eval-head.tokens
fi
[[ -z $model ]] && model=$root/../shared/models/tiny-qwen3
[[ -z $tokens ]] && tokens=$root/../shared/data/tiny-qwen3/eval.tokens
if [[ $model == *.tar.xz ]]; then
  mkdir -p /tmp/hf-model && tar -C /tmp/hf-model -xJf "$model" || { echo "run.sh: cannot unpack $model"; exit 1; }
  model=/tmp/hf-model/tiny-qwen3
fi
[[ -d $model && -f $tokens ]] || { echo "run.sh: model $model or tokens $tokens missing (give --carry)"; exit 1; }
params=$root/docs/eval/tiny-qwen3.oscar.safetensors
# Pure-Python wheels carried for the QuantizedCache baseline (perf/hf/pack.sh puts optimum-quanto there).
if [[ -n $carry && -d $carry/wheels ]] && ls "$carry"/wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/hf-wheels "$carry"/wheels/*.whl &&
    export PYTHONPATH=/tmp/hf-wheels${PYTHONPATH:+:$PYTHONPATH} && echo "wheels: $(ls "$carry"/wheels)"
fi
echo "== hf: $(date -u +%FT%TZ), $(nvidia-smi -L 2>/dev/null | head -1 || echo 'no nvidia-smi'), model $model"

# GPU engine in the background (its own CMake build, perf/e2e/run.sh's), while pip builds the package.
if ((engine)) && [[ -n $carry ]]; then
  # its own process group, so that a build running past its time can be stopped as a whole
  OUT=$out/e2e setsid bash "$root/perf/e2e/run.sh" --carry "$carry" --no-check --no-bench \
    >"$out/engine-build.log" 2>&1 &
  engine_pid=$!
else
  engine=0
fi

echo "== pip install ./python (minimal CUDA kernel set)"
(cd "$root" && CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --no-build-isolation --no-deps \
  --config-settings=cmake.define.OSCAR_GEN_SET=minimal ./python) || { echo "run.sh: pip install failed"; exit 1; }
echo "installed in $(( $(date +%s) - t0 )) s"
cd /tmp || exit 1  # import the installed package, not the source tree
python3 -c 'import liboscar, liboscar.hf; print("liboscar", liboscar.version(), liboscar.Runtime("cuda").device)' ||
  { echo "run.sh: the installed package cannot run on CUDA"; exit 1; }

etok=$out/engine-tokens.txt
: >"$etok"
if ((engine)); then
  # The engine's tokens are worth at most ~100 s of the budget; the bench needs the rest.
  while kill -0 "$engine_pid" 2>/dev/null && (($(left) > limit - 100)); do sleep 2; done
  if kill -0 "$engine_pid" 2>/dev/null; then
    echo "GPU engine build still running at $(( $(date +%s) - t0 )) s: stopped, no engine comparison"
    kill -- "-$engine_pid" 2>/dev/null
  fi
  wait "$engine_pid"; erc=$?
  bin=$root/build-e2e-dev/bin
  if ((erc != 0)) || [[ ! -x $bin/oscar-gpu-generate ]]; then
    echo "GPU engine build failed (rc $erc); last lines of its log:"; tail -15 "$out/engine-build.log"
  else
    echo "GPU engine built at $(( $(date +%s) - t0 )) s"
    for m in bf16 oscar2; do
      extra=(); [[ $m == oscar2 ]] && extra=(--params "$params")
      o=$(OSCAR_PLUGIN_PATH=$root/build-e2e-dev/lib timeout 120 "$bin/oscar-gpu-generate" "$model" \
          --prompt-tokens "$tokens" --prompt-len 1024 --n 64 --method $m "${extra[@]}" 2>&1)
      echo "$o" | grep -vE "^tokens:" | sed 's/^/  engine: /'
      echo "$o" | grep -E "^tokens:" | sed "s/^tokens:/$m:/" >>"$etok"
    done
  fi
fi

# Per-layer check of the CUDA path (OscarCache stepwise on the CUDA plugin vs the CPU fakequant reference).
echo "== per-layer check on CUDA (python/tests/test_hf.py -k cuda)"
layer_check=$(OSCAR_HF_MODEL=$model OSCAR_HF_TOKENS=$tokens timeout 120 python3 -m pytest -q -rs -W ignore::FutureWarning \
  "$root/python/tests/test_hf.py" -k cuda 2>&1 | tail -12)
echo "$layer_check"

if ((do_pytest)); then
  echo "== pytest python/tests"
  OSCAR_HF_MODEL=$model OSCAR_HF_TOKENS=$tokens timeout "$(( $(left) > 60 ? $(left) - 60 : 10 ))" \
    python3 -m pytest -q -rs -W ignore::FutureWarning "$root/python/tests" 2>&1 | tail -15
fi

echo "== bench ($(left) s left)"
python3 -W ignore::FutureWarning "$root/perf/hf/bench.py" --model "$model" --tokens "$tokens" --params "$params" \
  --engine-tokens "$etok" --md "$out/RESULTS.md" --time-limit "$(( $(left) > 90 ? $(left) - 15 : 75 ))"
rc=$?
if [[ -f $out/RESULTS.md ]]; then
  { echo; echo "### Per-layer check on CUDA"; echo
    echo "\`pytest python/tests/test_hf.py -k cuda\` (each layer's attention output through OscarCache on the CUDA"
    echo "plugin, stepwise, against the CPU fakequant reference on the same inputs; bound 1.6 % of max |out|):"
    echo; echo '```'; echo "$layer_check" | tail -3; echo '```'; } >>"$out/RESULTS.md"
fi
cp "$out/RESULTS.md" "$root/perf/hf/RESULTS.md" 2>/dev/null
echo "== done in $(( $(date +%s) - t0 )) s (rc $rc)"
exit $rc

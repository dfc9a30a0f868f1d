# Sourced by the A/B timing scripts (decode_ab.sh, write_path.sh): the
# NAME=BUILD ... [-- SHAPE ...] arguments into builds[] and shapes[] (default
# 32/8/128), and ab_rounds TAG [PATTERN]: bench_attention of every build,
# two rounds interleaved so clock drift hits all alike, into
# /tmp/TAG-NAME-ROUND.{tsv,log}; log lines matching PATTERN are echoed.
# BUILD: a folder with bench_attention and lib/liboscar_backend_cuda.so,
# optionally followed by @VAR=VALUE[,VAR=VALUE] (an environment of its own: one
# build timed with and without a runtime switch, e.g. lp=B@OSCAR_DECODE_LP=0).
# Tables go to $OUT (default /tmp/oscar-out).
OUT=${OUT:-/tmp/oscar-out}
mkdir -p "$OUT"
builds=() shapes=()
ab_args() {
  local seen=0 a
  for a in "$@"; do
    if [ "$a" = "--" ]; then seen=1; continue; fi
    if [ $seen = 1 ]; then shapes+=("$a"); else builds+=("$a"); fi
  done
  [ ${#shapes[@]} = 0 ] && shapes=(32/8/128)
  return 0
}
ab_rounds() {
  local tag=$1 pat=${2:-} round b name dir envs
  for round in 1 2; do
    for b in "${builds[@]}"; do
      name=${b%%=*} dir=${b#*=} envs=()
      if [[ $dir == *@* ]]; then IFS=, read -r -a envs <<< "${dir#*@}"; dir=${dir%%@*}; fi
      env "${envs[@]}" timeout 300 "$dir/bench_attention" "$dir/lib/liboscar_backend_cuda.so" "/tmp/$tag-$name-$round.tsv" \
        "${shapes[@]}" > "/tmp/$tag-$name-$round.log" 2>&1 || { tail -20 "/tmp/$tag-$name-$round.log"; exit 1; }
      [ -n "$pat" ] && grep -E "$pat" "/tmp/$tag-$name-$round.log" | sed "s/^/$name r$round: /"
    done
  done
  return 0
}

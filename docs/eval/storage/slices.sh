# Sourced by run.sh and run6.sh: the model, data and shipped parameters, and the validation
# slices of calib.tokens (uint32): valA from token 131072, valB from 327680, calibration
# text 2 = [196608, 262144) with its own calibrated parameters. Needs B (build) and O (out).
S=${SHARED:-../shared}
M=$S/models/tiny-qwen3; D=$S/data/tiny-qwen3; P=docs/eval/tiny-qwen3.oscar.safetensors
mkdir -p "$O"
tail -c +$((131072 * 4 + 1)) "$D/calib.tokens" > "$O/valA.tokens"
tail -c +$((327680 * 4 + 1)) "$D/calib.tokens" > "$O/valB.tokens"
dd if="$D/calib.tokens" of="$O/calib2.tokens" bs=4 skip=196608 count=65536 status=none
"$B/bin/oscar-calibrate" "$M" --tokens "$O/calib2.tokens" --threads 2 --out "$O/text2.oscar.safetensors" > /dev/null 2>&1

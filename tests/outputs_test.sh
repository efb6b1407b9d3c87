#!/usr/bin/env bash
# The output layer's rules (ulysses/io/output_file.hpp) on every writer of the CLI, and bounded
# reads: a device node, a FIFO, a symlink, one file named twice, an input named as an output,
# a full filesystem, /dev/zero as an input, and the training log on --resume. Every refusal is a
# non-zero exit within seconds naming the flag and the path, writes nothing, and leaves device
# nodes and inputs as they were.
# usage: outputs_test.sh ULYSSES_BINARY MPIEXEC "MPIEXEC_FLAGS" NPY_TOOL
source "$(dirname "$0")/cli_lib.sh" "$@"
trap 'umount "$dir/tmpfs" 2> /dev/null; rm -rf "$dir"' EXIT

succeed() {  # succeed NAME NP ARGS...
  local name=$1 n=$2; shift 2
  if run "$n" "$@" > "$dir/ok.log" 2>&1; then ok "$name"; else bad "$name: exit code $?"; cat "$dir/ok.log"; fi
}
same_sum() { [ "$(md5sum < "$1")" = "$2" ] && ok "$3: $1 intact" || bad "$3: $1 changed"; }

"$tool" make "$dir" 1 16 2 2 8 || { echo "cannot make inputs"; exit 1; }
files=(--q "$dir/q.npy" --k "$dir/k.npy" --v "$dir/v.npy")
q_sum=$(md5sum < "$dir/q.npy")
printf 'the corpus\nline two\n' > "$dir/c.txt" && c_sum=$(md5sum < "$dir/c.txt")
tiny=(train --seq 64 --batch 1 --width 16 --heads 2 --kv-heads 1 --head-dim 8 --hidden 24)
att=(attention --seq 32 --heads 2 --head-dim 8 --backward)
mkfifo "$dir/fifo"

# Every writer: FLAG, then the command that takes it (the output's value is appended).
writers=("--out|${att[*]}" "--dq|${att[*]}" "--dk|${att[*]}" "--dv|${att[*]}" "--json|${att[*]}"
         "--trace|${att[*]}" "--json|plan --seq 1024 --heads 8" "--svg|plan --seq 1024 --heads 8"
         "--log|${tiny[*]} --steps 1" "--svg|${tiny[*]} --steps 1" "--trace|${tiny[*]} --steps 1")

# 1. A device node (a private one: never the machine's own /dev/full), and a FIFO, are refused.
have_node=0
mknod "$dir/full" c 1 7 2> /dev/null && have_node=1 || echo "SKIP: device node (mknod needs root)"
for w in "${writers[@]}"; do
  flag=${w%%|*} cmd=(${w#*|})
  if [ $have_node -eq 1 ]; then
    expect "${cmd[0]} $flag DEVICE" 2 "$flag $dir/full: is a character device, not a regular file" "${cmd[@]}" "$flag" "$dir/full"
    [ -c "$dir/full" ] && [ "$(stat -c %t:%T "$dir/full")" = "1:7" ] && ok "the device node is intact" ||
      bad "${cmd[0]} $flag replaced the device node"
  fi
done
for w in "${writers[0]}" "${writers[6]}" "${writers[8]}"; do  # one rule in one place: a writer of each command
  flag=${w%%|*} cmd=(${w#*|})
  expect "${cmd[0]} $flag FIFO" 1 "$flag $dir/fifo: is a FIFO, not a regular file" "${cmd[@]}" "$flag" "$dir/fifo"
  [ -p "$dir/fifo" ] && ok "the FIFO is intact" || bad "${cmd[0]} $flag replaced the FIFO"
  expect "${cmd[0]} $flag DIRECTORY" 1 "$flag $dir: is a directory, not a regular file" "${cmd[@]}" "$flag" "$dir"
done
if [ $have_node -eq 1 ]; then
  mkdir -p "$dir/ckdev" && mknod "$dir/ckdev/checkpoint.bin" c 1 7
  expect "train --save onto a device" 1 "--save $dir/ckdev/checkpoint.bin: is a character device" "${tiny[@]}" \
    --steps 1 --save "$dir/ckdev"
  ln -s full "$dir/full_link"
  expect "a symlink to a device" 1 "--json $dir/full_link: is a character device" "${att[@]}" --json "$dir/full_link"
  [ -L "$dir/full_link" ] && [ -c "$dir/full" ] && [ "$(stat -c %t:%T "$dir/full")" = "1:7" ] &&
    ok "the link and the device are intact" || bad "the link to a device was replaced"
fi

# 2. A symlink is written through: the link stays, its target gets the new content.
for w in "${writers[@]}"; do
  flag=${w%%|*} cmd=(${w#*|})
  rm -f "$dir/target" "$dir/link" && echo old > "$dir/target" && ln -s target "$dir/link"
  succeed "${cmd[0]} $flag SYMLINK" 1 "${cmd[@]}" "$flag" "$dir/link"
  [ -L "$dir/link" ] && [ "$(readlink "$dir/link")" = target ] && [ -s "$dir/target" ] &&
    ! grep -qx old "$dir/target" && ok "written through the link" || bad "${cmd[0]} $flag: the link was not written through"
  ls "$dir"/target.tmp.* "$dir"/link.tmp.* > /dev/null 2>&1 && bad "temp files left" || true
done
rm -rf "$dir/ckpt_real" "$dir/ckpt" && mkdir "$dir/ckpt_real" && echo old > "$dir/ckpt_real/real.bin" &&
  ln -s real.bin "$dir/ckpt_real/checkpoint.bin"
succeed "train --save through a symlinked checkpoint.bin" 1 "${tiny[@]}" --steps 1 --save "$dir/ckpt_real"
[ -L "$dir/ckpt_real/checkpoint.bin" ] && ! grep -qx old "$dir/ckpt_real/real.bin" &&
  ok "checkpoint written through the link" || bad "checkpoint link replaced"

# 3. One file named for two outputs, by another spelling too; an input named as an output.
expect "--trace X --out X" 1 "--trace $dir/./x: the same file as --out $dir/x (named for two outputs)" "${att[@]}" \
  --out "$dir/x" --trace "$dir/./x"
no_file "$dir/x" "--trace X --out X"
expect "--dk X --dv X" 1 "named for two outputs" "${att[@]}" --dk "$dir/x" --dv "$dir/x"
expect "plan --json X --svg X" 1 "named for two outputs" plan --seq 1024 --heads 8 --json "$dir/x" --svg "$dir/x"
expect "train --log X --svg X" 1 "--svg $dir/x: the same file as --log $dir/x" "${tiny[@]}" --steps 1 --log "$dir/x" --svg "$dir/x"
no_file "$dir/x" "train --log X --svg X"
echo old > "$dir/hard" && ln "$dir/hard" "$dir/hard2"
expect "two hard links of one file" 1 "named for two outputs" "${att[@]}" --out "$dir/hard" --json "$dir/hard2"
for flag in --out --dq --json --trace; do
  expect "attention $flag q.npy" 2 "$flag $dir/q.npy: the same file as the input --q $dir/q.npy" attention "${files[@]}" \
    --dout "$dir/dout.npy" "$flag" "$dir/q.npy"
done
same_sum "$dir/q.npy" "$q_sum" "inputs named as outputs"
ln -s q.npy "$dir/q_link.npy"
expect "--out a symlink to --q" 1 "the same file as the input --q" attention --q "$dir/q_link.npy" --k "$dir/k.npy" \
  --v "$dir/v.npy" --out "$dir/q.npy"
printf '0,8,16\n' > "$dir/cu.txt" && cu_sum=$(md5sum < "$dir/cu.txt")
expect "--json onto --cu-seqlens" 1 "the same file as the input --cu-seqlens" attention --seq 16 --heads 2 \
  --head-dim 8 --cu-seqlens "$dir/cu.txt" --json "$dir/cu.txt"
same_sum "$dir/cu.txt" "$cu_sum" "--cu-seqlens named as output"
for flag in --log --svg --trace; do
  expect "train --data c.txt $flag c.txt" 2 "$flag $dir/c.txt: the same file as the input --data $dir/c.txt" \
    "${tiny[@]}" --steps 1 --data "$dir/c.txt" "$flag" "$dir/c.txt"
done
same_sum "$dir/c.txt" "$c_sum" "train --data named as output"
succeed "a checkpoint for --resume" 1 "${tiny[@]}" --steps 1 --save "$dir/ckpt"
ck_sum=$(md5sum < "$dir/ckpt/checkpoint.bin")
expect "--log onto the --resume checkpoint" 1 "the same file as the input --resume" "${tiny[@]}" --steps 2 \
  --resume "$dir/ckpt" --log "$dir/ckpt/checkpoint.bin"
same_sum "$dir/ckpt/checkpoint.bin" "$ck_sum" "--resume checkpoint named as --log"
succeed "--save over the checkpoint it resumed" 1 "${tiny[@]}" --steps 2 --resume "$dir/ckpt" --save "$dir/ckpt"
expect "--svg - (no standard output there)" 1 "--svg -: --svg cannot go to standard output" plan --seq 1024 --heads 8 --svg -
run 1 plan --seq 1024 --heads 8 --json - > "$dir/plan_stdout" 2>&1 && grep -q '"best"' "$dir/plan_stdout" &&
  ok "--json - writes to standard output" || { bad "--json -"; cat "$dir/plan_stdout"; }

# 4. Every output path is checked before any work: nothing is written, no step is taken.
expect "attention --trace to a missing folder" 2 "--trace $dir/missing/t.json: cannot write here" "${att[@]}" \
  --out "$dir/o.npy" --trace "$dir/missing/t.json"
no_file "$dir/o.npy" "attention --trace to a missing folder"
expect "train --svg to a missing folder" 2 "--svg $dir/missing/l.svg: cannot write here" "${tiny[@]}" --steps 1 \
  --log "$dir/l.jsonl" --svg "$dir/missing/l.svg"
no_file "$dir/l.jsonl" "train --svg to a missing folder"
grep -q "step 1/1" "$dir/err.log" && bad "train --svg to a missing folder: it trained first" || ok "no step before the check"

# 5. Special and oversized inputs are refused by name before anything is read.
expect "--data /dev/zero" 2 "--data /dev/zero: is a character device, not a regular file" "${tiny[@]}" --steps 1 --data /dev/zero
expect "--data FIFO" 2 "--data $dir/fifo: is a FIFO" "${tiny[@]}" --steps 1 --data "$dir/fifo"
expect "--cu-seqlens /dev/zero" 2 "--cu-seqlens /dev/zero: is a character device" attention --seq 16 --cu-seqlens /dev/zero
expect "--cu-seqlens FIFO.npy" 2 "is a FIFO" attention --seq 16 --cu-seqlens "$dir/fifo"
expect "--q /dev/zero" 2 "/dev/zero: is a character device" attention --q /dev/zero --k "$dir/k.npy" --v "$dir/v.npy"
mkdir -p "$dir/zero_ckpt" && ln -s /dev/zero "$dir/zero_ckpt/checkpoint.bin"
expect "--resume onto /dev/zero" 2 "--resume $dir/zero_ckpt/checkpoint.bin: is a character device" "${tiny[@]}" \
  --steps 1 --resume "$dir/zero_ckpt"
ULYSSES_MEM_AVAILABLE=10 expect "--data larger than memory" 2 "--data $dir/c.txt: is 20 bytes, more than the memory available" \
  "${tiny[@]}" --steps 1 --data "$dir/c.txt"

# 6. --resume keeps the log through the checkpoint's step: the steps of a run killed after it
#    are not kept, and not repeated.
rm -rf "$dir/ck2" "$dir/run.jsonl"
succeed "train 2 steps, checkpoint" 1 "${tiny[@]}" --steps 2 --save "$dir/ck2" --log "$dir/run.jsonl"
succeed "train on to 5 (not saved: as if killed)" 1 "${tiny[@]}" --steps 5 --resume "$dir/ck2" --log "$dir/run.jsonl"
printf '{"step": 6, "loss": 1.0' >> "$dir/run.jsonl"  # a line cut short by the kill
succeed "resume from step 2 to 4" 2 "${tiny[@]}" --steps 4 --resume "$dir/ck2" --log "$dir/run.jsonl"
steps=$(python3 -c 'import json, sys; print(",".join(str(json.loads(l)["step"]) for l in open(sys.argv[1])))' "$dir/run.jsonl")
[ "$steps" = "1,2,3,4" ] && ok "resumed log holds steps 1,2,3,4" || { bad "resumed log holds steps '$steps'"; cat "$dir/run.jsonl"; }
succeed "a fresh run empties the log" 1 "${tiny[@]}" --steps 1 --log "$dir/run.jsonl"
[ "$(wc -l < "$dir/run.jsonl")" = 1 ] && ok "fresh log: one line" || bad "fresh log: $(wc -l < "$dir/run.jsonl") lines"

# 7. A full filesystem (a 64 KiB tmpfs; root only): every writer fails naming the file and the
#    errno, and the old file stays.
mkdir -p "$dir/tmpfs"
if mount -t tmpfs -o size=64k tmpfs "$dir/tmpfs" 2> /dev/null; then
  echo "the old content" > "$dir/tmpfs/old" && old_sum=$(md5sum < "$dir/tmpfs/old")
  head -c 1M /dev/zero > "$dir/tmpfs/filler" 2> /dev/null  # fills it
  for w in "${writers[@]}"; do
    flag=${w%%|*} cmd=(${w#*|})
    expect "${cmd[0]} $flag on a full disk" 1 "$dir/tmpfs/old: write failed: No space left on device" "${cmd[@]}" \
      "$flag" "$dir/tmpfs/old"
    same_sum "$dir/tmpfs/old" "$old_sum" "${cmd[0]} $flag on a full disk"
  done
  mkdir -p "$dir/tmpfs/ck" 2> /dev/null
  if [ -d "$dir/tmpfs/ck" ]; then
    expect "train --save on a full disk" 1 "--save $dir/tmpfs/ck: $dir/tmpfs/ck/checkpoint.bin: write failed: No space" \
      "${tiny[@]}" --steps 1 --save "$dir/tmpfs/ck"
  fi
  [ -z "$(ls "$dir/tmpfs" | grep -v '^old$\|^filler$\|^ck$')" ] && ok "full disk left no temp file" ||
    bad "full disk left $(ls "$dir/tmpfs")"
  # The log fills the disk during training: it stops there, every line whole.
  rm -f "$dir/tmpfs/filler" "$dir/tmpfs/old" && head -c 57344 /dev/zero > "$dir/tmpfs/filler"
  expect "train --log filling the disk" 1 "--log $dir/tmpfs/log.jsonl: write failed: No space left on device" \
    "${tiny[@]}" --steps 400 --log "$dir/tmpfs/log.jsonl"
  lines=$(wc -l < "$dir/tmpfs/log.jsonl")
  [ -s "$dir/tmpfs/log.jsonl" ] && [ "$(tail -c 1 "$dir/tmpfs/log.jsonl" | od -An -c | tr -d ' ')" = '\n' ] &&
    python3 -c 'import json, sys; [json.loads(l) for l in open(sys.argv[1])]' "$dir/tmpfs/log.jsonl" &&
    ok "the log on a full disk ends with a whole line ($lines lines)" || { bad "log cut mid-line"; tail -c 300 "$dir/tmpfs/log.jsonl"; }
  umount "$dir/tmpfs"
else
  echo "SKIP: full disk (cannot mount a tmpfs here: needs root)"
fi

echo "$fails failure(s)"
[ $fails -eq 0 ]

#!/usr/bin/env bash
# test_cli_options.sh — what each frugal command accepts and refuses. It keeps
# its own list of every option and of the commands that take it (written from
# what each command uses, not read from frugal.c), and checks that every
# command lists exactly those in --help, accepts each of them, and refuses
# every other option with exit 2 and a message naming the option and the
# command. Then the strict parsing of numbers, sizes and empty values, files
# that are not regular files (a FIFO never hangs), and the messages the issue
# named: the --accumulate value, estimate's model error printed once.
source "$(dirname "$0")/lib.sh"

commands=(train eval estimate plan profile generate)
# option -> the commands that take it (t train, e eval, s estimate, p plan,
# f profile, g generate) and a valid value ("-" for a flag).
declare -A takes value
add() { takes[$1]=$2; value[$1]=$3; }
add model          tespfg mlp
add weights        eg    w.safetensors
add batch          tespf 32
add threads        tespfg 1
add device         tespfg cpu
add offload        tspf  optimizer
add sync-upload    t     -
add json           tespf -
add no-progress    te    -
add quiet          t     -
add data           tep   /nonexistent
add train-images   tp    a.npy
add train-labels   tp    b.npy
add test-images    tep   a.npy
add test-labels    tep   b.npy
add limit          tp    10
add test-limit     tep   10
add epochs         t     1
add seed           tfg   1
add seq            tespf 16
add val-fraction   tep   0.2
add eval-interval  t     10
add prompt         g     hello
add tokens         g     5
add temperature    g     0.5
add top-k          g     3
add window         g     slide
add save           t     x.safetensors
add save-every     t     10
add save-weights-only t  -
add nanogpt-masks  t     -
add resume         t     x.safetensors
add init           t     x.safetensors
add eval           s     -
add steps          tf    1
add trace          f     t.json
add svg            f     m.svg
add optimizer      tspf  sgd
add lr             tf    0.1
add momentum       tspf  0.9
add nesterov       tf    -
add dampening      tf    0.1
add weight-decay   tf    0.1
add eps            tf    1e-8
add beta1          tspf  0.9
add beta2-decay    tf    -0.5
add eps2           tf    1e-3
add clip-threshold tf    1
add zero-grad      tf    zero
add keep-grads     tspf  -
add budget         tspf  1MiB
add checkpoint     tspf  sqrt
add segments       tspf  2
add accumulate     tspf  2
add micro-batch    tspf  2
add fused-head     tespf auto
add freeze         tspf  0
add lora           tspf  r=2,target=0
add adapter        teg   ad
add save-adapter   t     ad
add merge          te    m.safetensors
add precision      tspf  bf16-mixed
add base-precision tspf int8
add optimizer-state tspf int8
add loss-scale     tspf  none
add clip-grad-norm tspf  1
add ranks          sp    2
add zero           tsp   0
add bucket-cap-mb  t     1
add no-overlap     t     -
add top-p          g     0.9
add stop-at-eos    g     off
add max-context    g     16
add tokenizer      teg   tok.json
letter() { case $1 in train) echo t ;; eval) echo e ;; estimate) echo s ;; plan) echo p ;; profile) echo f ;; generate) echo g ;; esac; }
args_of() { if [ "${value[$1]}" = - ]; then echo "--$1"; else echo "--$1 ${value[$1]}"; fi; }

for cmd in "${commands[@]}"; do
    l=$(letter "$cmd")
    # --help lists exactly the options the command takes (and --help).
    "$bin" "$cmd" --help >"$tmp/help" 2>&1 || no "$cmd --help exits 0"
    grep -oE '^  --[a-z0-9-]+' "$tmp/help" | sed 's/^  --//' | sort -u >"$tmp/listed"
    { echo help; for o in "${!takes[@]}"; do [[ ${takes[$o]} == *$l* ]] && echo "$o"; done; } | sort -u >"$tmp/want"
    diff "$tmp/want" "$tmp/listed" >"$tmp/diff" && ok || no "$cmd --help lists other options than it takes: $(tr '\n' ' ' <"$tmp/diff")"
    for o in "${!takes[@]}"; do
        # shellcheck disable=SC2046
        if [[ ${takes[$o]} == *$l* ]]; then
            # accepted: parsed without complaint, then --help
            "$bin" "$cmd" $(args_of "$o") --help >/dev/null 2>"$tmp/err" && ok || no "$cmd accepts --$o: $(head -2 "$tmp/err")"
        else
            "$bin" "$cmd" $(args_of "$o") >/dev/null 2>"$tmp/err"
            rc=$?
            [ $rc -eq 2 ] && grep -q -- "--$o is not an option of $cmd" "$tmp/err" && ok ||
                no "$cmd must refuse --$o: exit $rc, $(head -2 "$tmp/err")"
        fi
    done
done
# The issue's examples, spelled out.
"$bin" eval --budget 1MiB --save x >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q -- "--budget is not an option of eval.*belongs to train, estimate, plan and profile" "$tmp/err" &&
    ok || no "eval --budget --save: $(cat "$tmp/err")"
"$bin" train --weights x >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q -- "--weights is not an option of train" "$tmp/err" && ok || no "train --weights: $(cat "$tmp/err")"

refuse() { # pattern, command line...: exit 2 and the pattern in stderr
    local pat=$1; shift
    "$bin" "$@" >/dev/null 2>"$tmp/err"
    local rc=$?
    [ $rc -eq 2 ] && grep -qF -- "$pat" "$tmp/err" && ok || no "$* must be refused naming '$pat': exit $rc, $(head -2 "$tmp/err")"
}
accept() { # command line... (parsed, then --help: exit 0)
    "$bin" "$@" --help >/dev/null 2>"$tmp/err" && ok || no "$* must be accepted: $(head -2 "$tmp/err")"
}

# Whole numbers: decimal digits only, within range; never truncated.
refuse "--batch '1.5'" train --batch 1.5
refuse "--epochs '1.9'" train --epochs 1.9
refuse "--batch '0x20'" train --batch 0x20
refuse "--batch '1e3'" train --batch 1e3
refuse "--seed '-1'" train --seed -1
refuse "--batch ' 32'" train --batch " 32"
refuse "--threads '2x'" plan --threads 2x
refuse "--limit '0'" train --limit 0
refuse "--seed '18446744073709551616'" train --seed 18446744073709551616
refuse "--accumulate '2.5'" train --accumulate 2.5
accept train --seed 18446744073709551615 --batch 1048576 --epochs 3
# Reals: the whole string, finite, in range.
refuse "--lr '0.1x'" train --lr 0.1x
refuse "--lr 'nan'" train --lr nan
refuse "--lr 'inf'" train --lr inf
refuse "--lr '0x1p-3'" train --lr 0x1p-3
refuse "--momentum '1e999'" train --optimizer sgd --momentum 1e999
refuse "--momentum '-0.5'" train --optimizer sgd --momentum -0.5
refuse "--beta2-decay, --eps2 and --clip-threshold are Adafactor options, not adam" train --eps2 1e-3
refuse "--beta2-decay, --eps2 and --clip-threshold are Adafactor options, not sgd" train --optimizer sgd --clip-threshold 2
refuse "--beta1 is an Adam, AdamW and Adafactor option, not sgd" train --optimizer sgd --beta1 0.5
refuse "--beta2-decay '0.5'" train --optimizer adafactor --beta2-decay 0.5
refuse "--clip-threshold '0'" train --optimizer adafactor --clip-threshold 0
refuse "--beta1 '1'" train --optimizer adafactor --beta1 1
refuse "--zero 1: adafactor's factored state belongs to whole matrices" estimate --optimizer adafactor --ranks 2 --zero 1
refuse "--zero 2: adafactor's factored state" train --optimizer adafactor --zero 2
accept train --lr 1e-3 --eps .5 --weight-decay 0
# Empty values, missing values, unknown and abbreviated options.
refuse "--freeze ''" train --freeze ''
refuse "--freeze ''" plan --freeze=
refuse "--model ''" estimate --model ''
refuse "--save needs a value" train --save
refuse "--save needs a value" train --save --json
refuse "--batch 'auto'" eval --batch auto
refuse "unknown option '--bud' (options are spelled in full: --budget?)" plan --bud 1MiB
refuse "--json takes no value" estimate --json=1
refuse "unexpected argument 'extra'" estimate extra
# Pairs of files, --init against --resume, the --accumulate value.
refuse "--train-images and --train-labels" train --train-images a.npy
refuse "--test-images and --test-labels" eval --test-labels b.npy
refuse "--init or --resume" train --init a.safetensors --resume b.safetensors
refuse "--accumulate 3 does not divide the batch 128" train --batch 128 --accumulate 3
refuse "--accumulate 5 does not divide the batch 64" plan --batch 64 --accumulate 5
refuse "--fused-head 'half': expected off, auto or a number of rows" train --fused-head half
refuse "--fused-head '0': expected a whole number from 1" estimate --fused-head 0

# Checkpoint modes: the number after ':' is decimal digits too.
for v in every:+3 "every: 3" every:0x3 revolve:100001; do refuse "--checkpoint '$v'" plan --checkpoint "$v"; done
accept plan --checkpoint every:0003
accept plan --checkpoint revolve:100000

# Sizes (--budget): too large says so; the usual spellings keep working.
refuse "'1e30GiB' is too large" plan --model mlp --budget 1e30GiB
refuse "'1e999' is too large" plan --model mlp --budget 1e999
for b in -5MiB nan inf MiB 0x10 "48 MiB" 0 1.5e; do refuse "--budget '$b'" plan --model mlp --budget "$b"; done
printf 'input 8\nlinear 2\n' >"$tmp/small.model"
for spec in 1.5GiB:1610612736 48MiB:50331648 500MB:500000000 64M:67108864 2345678:2345678 8192KiB:8388608 1e6:1000000; do
    "$bin" plan --model "$tmp/small.model" --batch 1 --budget "${spec%%:*}" --json >"$tmp/out" 2>"$tmp/err" &&
        python3 -c "import json,sys; assert json.load(open(sys.argv[1]))['budget'] == int(sys.argv[2])" "$tmp/out" "${spec##*:}" &&
        ok || no "--budget ${spec%%:*} is ${spec##*:} bytes: $(head -2 "$tmp/err") $(head -c 200 "$tmp/out")"
done

# A model error is printed once.
"$bin" estimate --model "$tmp/nope.model" >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && [ "$(grep -c nope.model "$tmp/err")" -eq 1 ] && ok || no "estimate prints the model error once: $(cat "$tmp/err")"
"$bin" estimate --model "$tmp/small.model" --freeze fc9 >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && [ "$(grep -c fc9 "$tmp/err")" -eq 1 ] && ok || no "estimate prints a freeze error once: $(cat "$tmp/err")"

# --threads reaches the planner: a convolution's workspace on the GEMM path
# holds one slot per thread, so resnet at batch 16 plans differently with 1
# and 16 threads; with OMP_NUM_THREADS=16 in the environment, --threads 1 must
# give the 1-thread plan. (FRUGAL_LAYOUT=plain keeps the ResNet's
# convolutions on the GEMMs; blocked, they run on oneDNN with no slots.)
peak() { python3 -c "import json,sys; print(json.load(sys.stdin)['predicted_peak_total'])"; }
for cmd in estimate plan; do
    one=$(FRUGAL_LAYOUT=plain OMP_NUM_THREADS=1 "$bin" $cmd --model resnet --batch 16 --json | peak)
    many=$(FRUGAL_LAYOUT=plain OMP_NUM_THREADS=16 "$bin" $cmd --model resnet --batch 16 --json | peak)
    got=$(FRUGAL_LAYOUT=plain OMP_NUM_THREADS=16 "$bin" $cmd --model resnet --batch 16 --threads 1 --json | peak)
    [ -n "$one" ] && [ "$one" != "$many" ] && [ "$got" = "$one" ] && ok ||
        no "$cmd --threads 1: peak $got, want the 1-thread $one (16 threads: $many)"
done

# Files that are not regular files are refused at once, never waited on.
mkfifo "$tmp/fifo"
mkdir "$tmp/dir"
notregular() { # description, pattern, command line... (exit 1; the timeout only catches a hang)
    local d=$1 pat=$2; shift 2
    timeout 60 "$bin" "$@" >/dev/null 2>"$tmp/err"
    local rc=$?
    [ $rc -eq 1 ] && grep -qF -- "$pat" "$tmp/err" && ok ||
        no "$d: exit $rc$([ $rc -eq 124 ] && echo ' (hung, killed after 60 s)'), $(head -2 "$tmp/err")"
}
notregular "FIFO as --model" "is a FIFO" estimate --model "$tmp/fifo"
notregular "directory as --model" "is a directory" plan --model "$tmp/dir"
notregular "FIFO as --weights" "is a FIFO" eval --model "$tmp/small.model" --weights "$tmp/fifo"
notregular "directory as --weights" "is a directory" eval --model "$tmp/small.model" --weights "$tmp/dir"
grep -q "Inappropriate ioctl" "$tmp/err" && no "eval --weights DIR reports a stale errno: $(cat "$tmp/err")" || ok
notregular "FIFO as --train-images" "is a FIFO" train --model "$tmp/small.model" --train-images "$tmp/fifo" \
    --train-labels "$tmp/fifo" --no-progress
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    mkfifo "$tmp/dir/$f"
done
notregular "FIFO in --data" "is a FIFO" train --model "$tmp/small.model" --data "$tmp/dir" --no-progress

finish

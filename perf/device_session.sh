#!/usr/bin/env bash
# One device call, in budgeted steps (each with its own timeout, so one slow or hung step cannot eat
# the call): GPU tests per family, optional ncu / sanitizer / small-size probes, then benchmarks.
# Logs go to $OUT/session.log (one file: the device returns at most 8), results to
# $OUT/<suite>.{json,md,png}; a compact summary is printed.
#
#   bash perf/device_session.sh [tests=FAMILIES] [bench=SUITES] [quick] [ncu] [pcs] [small] [sanitize] [large] [par] [tunerows] [kt] [clocks] [sched]
#   ncu: NCU=probes (see below), NCU_EXTRA=extra comma-separated metrics, PROBE_WARM=N untimed runs
#        before the profiled ones (perf/probe.py; ncu then profiles from cudaProfilerStart), NCU_SECTIONS=comma
#        list of whole sections (e.g. MemoryWorkloadAnalysis_Tables) printed into the log, NCT=timeout each,
#        NCL=kernels profiled per probe (default 1; with "regex:." and PROBE_WARM every kernel of one call)
#   pcs: per-SASS-instruction stall sampling of PCS="probe args@kernel@skip;..." (perf/ncu_pcs.py; PT=timeout)
#   clocks: sustained runs with SM clock and power sampled (perf/clocks.py; CLK="target;..." or its defaults, CLKT=timeout)
#   sched: cute-kernels schedules searches (SCHED="attention 2 8192 16 128 causal;gemm 8192 8192 8192", SL=limit,
#          SCT=timeout each, SHOW=rows printed); tables to $OUT/schedules_*.md
#   kt: each call's kernels and GPU span of KT="probe args;..." (perf/kernel_times.py; KTT=timeout)
#   tunerows: perf.tune_rows (held-row plan sweep; TR=timeout, TRARGS=its arguments)
#   par: run the test families concurrently (TT=seconds per family, default 240)
#   XN=N: each family's tests in N pytest-xdist workers (the GPU tests are compile-bound: session 25 ran the 225
#         attention tests with -n 12 in 73 s, against > 300 s in one process)
#   TK: a pytest -k expression applied to every named family (e.g. TK="deep_ring or alpha_beta": a family's
#       new tests without the rest of it, which may not fit TT in parallel with others: gemm took > 210 s)
#     FAMILIES: comma list of test folders tests/<family>/ (elementwise, ..., attention) or "all" (every folder
#               with GPU tests); default: none (a call that names no tests runs none: the whole set takes
#               longer than one call may run)
#     SUITES:   comma list of bench suites (each family's bench.py SUITES; `cute-kernels bench nosuch` lists
#               them) or "all"; default: none
set -u
OUT=${OUT:-/tmp/ck_out}; mkdir -p "$OUT"; LOG="$OUT/session.log"; : > "$LOG"
TESTS=none; BENCH=none; ARGS=" "
for a in "$@"; do
  case $a in tests=*) TESTS=${a#tests=};; bench=*) BENCH=${a#bench=};; *) ARGS="$ARGS$a ";; esac
done
has() { [[ $ARGS == *" $1 "* ]]; }
# Everything under $OUT but the log goes into results.tar (the device returns at most 8 files).
archive() { ( cd "$OUT" && ls | grep -v -E '^(session.log|results.tar)$' > .list; [ -s .list ] && tar rf results.tar -T .list && xargs rm -f < .list; rm -f .list ); }
section() { echo "===== $1" >> "$LOG"; }
P="-q -p no:cacheprovider -W ignore --tb=line -rf -o faulthandler_timeout=90"

if [ "$TESTS" != none ]; then
  [ "$TESTS" = all ] && TESTS=$(ls tests/*/test_*_gpu.py | cut -d/ -f2 | sort -u | paste -sd, -)  # every family
  TT=${TT:-240}
  runfam() {  # one family; log to $OUT/.p.$1
    timeout -k 5 -s INT $TT python3 -m pytest tests/${1} -m "gpu and not large and not sweep" ${TK:+-k "$TK"} --maxfail=25 \
      ${XN:+-n $XN} $P > "$OUT/.p.$1" 2>&1
  }
  if has par; then  # families side by side (compiles are CPU-bound; 16 cores): correctness only, no timing
    for f in ${TESTS//,/ }; do runfam $f & done; wait
  fi
  for f in ${TESTS//,/ }; do
    has par || runfam $f
    section "pytest $f"; cat "$OUT/.p.$f" >> "$LOG"
    echo "tests $f: $(grep -E '(passed|failed|error)' "$OUT/.p.$f" | tail -1)"; grep -E "^(FAILED|ERROR)" "$OUT/.p.$f" | cut -c1-180 | head -8
    grep -q -E '(passed|failed|error)' "$OUT/.p.$f" || tail -5 "$OUT/.p.$f"
    rm -f "$OUT/.p.$f"
  done
fi
if has large; then
  section pytest-large; timeout -k 5 -s INT 300 python3 -m pytest tests -m large $P > "$OUT/.p" 2>&1
  cat "$OUT/.p" >> "$LOG"; echo "tests large: $(tail -1 "$OUT/.p")"; rm -f "$OUT/.p"
fi
if has ncu; then
  # NCU: ";"-separated "probe args@kernel regex@launches to skip" (perf/probe.py targets). cuBLAS
  # on CUDA 13 names its Hopper GEMMs nvjet_* (the old sm90_xmma_* regex matched nothing)
  NCU=${NCU:-"gemm bf16 8192 8192 8192@regex:kernel_cutlass@0;torch.mm bf16 8192 8192 8192@regex:nvjet|xmma|gemm@0;copy bf16 524288@regex:kernel_cutlass@2;torch.copy bf16 524288@regex:.@4"}
  M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__warp_issue_stalled_barrier_per_warp_active.pct,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_wait_per_warp_active.pct,smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct,launch__registers_per_thread,launch__grid_size${NCU_EXTRA:+,$NCU_EXTRA}
  IFS=';' read -ra PROBES <<< "$NCU"
  for e in "${PROBES[@]}"; do
    IFS='@' read -r p K S <<< "$e"
    section "ncu $p"
    SECS=""; for x in ${NCU_SECTIONS:+${NCU_SECTIONS//,/ }}; do SECS="$SECS --section $x"; done  # whole ncu sections, in the log
    timeout ${NCT:-90} ncu --clock-control none ${PROBE_WARM:+--profile-from-start off} -k "$K" --launch-skip "${S:-0}" --launch-count ${NCL:-1} --metrics $M $SECS python3 -m perf.probe $p > "$OUT/.n" 2>&1
    cat "$OUT/.n" >> "$LOG"
    echo "ncu $p: $(grep -E "^\s+(gpu__time|dram__|lts__|sm__|smsp__|launch__grid)" "$OUT/.n" | awk '{printf "%s=%s ", $1, $NF}' | sed 's/\.avg\.pct_of_peak_sustained_\(elapsed\|active\)//g; s/_per_warp_active\.pct//g')"
  done
  rm -f "$OUT/.n"
fi
if has pcs; then
  # PCS: ";"-separated "probe args@kernel regex@launches to skip": per-instruction PC sampling (perf/ncu_pcs.py)
  IFS=';' read -ra PP <<< "${PCS:-flash_attn bf16 2 8192 16 128@regex:kernel_cutlass@2}"
  for e in "${PP[@]}"; do
    IFS='@' read -r p K S <<< "$e"
    section "pcs $p"
    timeout ${PT:-150} python3 -m perf.ncu_pcs --probe "$p" --kernel "$K" --skip "${S:-0}" --out "$OUT" --top ${PTOP:-20} > "$OUT/.n" 2>&1
    cat "$OUT/.n" >> "$LOG"; echo "pcs $p:"; head -12 "$OUT/.n"
  done
  rm -f "$OUT/.n"
fi
if has kt; then  # KT: ";"-separated probe targets, each call's kernels and GPU span (perf/kernel_times.py)
  section kernel_times; IFS=';' read -ra KK <<< "${KT:-rmsnorm.bwd bf16 32768 4096}"
  timeout ${KTT:-120} python3 -m perf.kernel_times "${KK[@]}" > "$OUT/.k" 2>&1; cat "$OUT/.k" >> "$LOG"; grep -v "^\s*$" "$OUT/.k" | head -60; rm -f "$OUT/.k"
fi
if has clocks; then  # CLK: ";"-separated perf.probe-style targets run back to back, SM clock + power sampled
  section clocks; IFS=';' read -ra CC <<< "${CLK:-}"
  timeout ${CLKT:-200} python3 -m perf.clocks "${CC[@]}" > "$OUT/.c" 2>&1; cat "$OUT/.c" >> "$LOG"; grep -E "^\| |Error|error" "$OUT/.c" | tail -12; rm -f "$OUT/.c"
fi
if has tunerows; then  # TRARGS: one sweep's arguments, or several separated by "|" (each its own TR seconds, its
  # results in $OUT/tune_rows.md, then tune_rows_2.md, ...)
  IFS='|' read -ra SWEEPS <<< "${TRARGS:- }"; i=1
  for a in "${SWEEPS[@]}"; do
    section "tune_rows $a"; d="$OUT"; [ $i -gt 1 ] && d="$OUT/.tr$i" && mkdir -p "$d"
    timeout ${TR:-300} python3 -m perf.tune_rows --out "$d" $a > "$OUT/.s" 2>&1; cat "$OUT/.s" >> "$LOG"
    [ $i -gt 1 ] && [ -f "$d/tune_rows.md" ] && mv "$d/tune_rows.md" "$OUT/tune_rows_$i.md"; rm -rf "$OUT/.tr$i"
    echo "tune_rows $a:"; grep -E "^\| " "$OUT/.s" | tail -40; rm -f "$OUT/.s"; i=$((i+1))
  done
fi
if has sched; then  # SCHED: ";"-separated "gemm M N K" / "attention B S H D [causal]" searches (SL: --limit, SCT: timeout)
  IFS=';' read -ra SS <<< "${SCHED:-attention 2 8192 16 128 causal}"
  for e in "${SS[@]}"; do
    read -r kern dims <<< "$e"; c=""; [[ $dims == *causal* ]] && c="--causal"; dims=${dims//causal/}
    section "schedules $e"
    timeout ${SCT:-240} python3 -m cute_kernels schedules $kern --shape $dims $c --limit ${SL:-24} --out "$OUT" > "$OUT/.s" 2>&1
    cat "$OUT/.s" >> "$LOG"; echo "schedules $e:"; grep -E "^\| [0-9]" "$OUT/.s" | head -${SHOW:-8}; rm -f "$OUT/.s"
  done
fi
if has small; then section small; timeout ${ST:-200} python3 -m perf.small --out "$OUT" ${SMALLARGS:-} > "$OUT/.s" 2>&1; cat "$OUT/.s" >> "$LOG"; grep "^|" "$OUT/.s"; rm -f "$OUT/.s"; fi
if has sanitize; then
  for p in "add bf16 1048579" "row_sum bf16 3 769" "sum fp32 1000003" "gemm bf16 769 2112 1032"; do
    for tool in memcheck racecheck; do
      section "sanitizer $tool $p"
      r=$(timeout 120 compute-sanitizer --tool $tool --report-api-errors no python3 -m perf.probe $p 2>&1 | tee -a "$LOG" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY" | tr '\n' ' ')
      echo "sanitizer $tool $p: ${r:-no summary line (see log)}"
    done
  done
fi
if [ "$BENCH" != none ]; then
  [ "$BENCH" = all ] && BENCH=all
  Q=""; has quick && Q="--quick"
  for b in ${BENCH//,/ }; do
    section "bench $b"
    timeout -k 5 -s INT ${BT:-400} python3 -m cute_kernels bench "$b" $Q --out "$OUT" > "$OUT/.b" 2>&1
    cat "$OUT/.b" >> "$LOG"
    echo "bench $b:"; grep -E "^\[(PASS|FAIL)\]|Error|error" "$OUT/.b" | cut -c1-200 | head -12
    # into the archive as each suite finishes (a call cut short still returns what was done)
    archive
  done
  rm -f "$OUT/.b"
fi
# the device returns at most 8 files: pack everything into one archive beside the log
archive

#!/usr/bin/env bash
# One device call: fill the compile cache, run the GPU tests (the >2^31-element ones in their own
# process), optional tuning / ncu / sanitizer probes, then the benchmarks.
# Everything is logged to $OUT/session.log; results to $OUT/<suite>.{json,md,png}; a summary is printed.
#   bash perf/device_session.sh [tune] [ncu] [small] [sanitize] [quick] [nobench]
set -u
OUT=${OUT:-/tmp/ck_out}; mkdir -p "$OUT"; LOG="$OUT/session.log"; : > "$LOG"
ARGS=" $* "
has() { [[ $ARGS == *" $1 "* ]]; }
section() { echo "===== $1" >> "$LOG"; }
section precompile; python3 -m cute_kernels compile --all --sweep --jobs 16 >> "$LOG" 2>&1; tail -1 "$LOG"
section pytest; python3 -m pytest -q tests -m "gpu and not large" -p no:cacheprovider > "$OUT/.p1" 2>&1
cat "$OUT/.p1" >> "$LOG"; echo "pytest (gpu): $(tail -1 "$OUT/.p1")"; grep -E "^(FAILED|ERROR)" "$OUT/.p1" | head -20
section pytest-large; python3 -m pytest -q tests -m "large" -p no:cacheprovider > "$OUT/.p2" 2>&1
cat "$OUT/.p2" >> "$LOG"; echo "pytest (large): $(tail -1 "$OUT/.p2")"; grep -E "^(FAILED|ERROR)" "$OUT/.p2" | head -20
rm -f "$OUT/.p1" "$OUT/.p2"
if has tune; then section tune; python3 -m perf.tune --out "$OUT" > "$OUT/.t" 2>&1; cat "$OUT/.t" >> "$LOG"; grep -v "^precompiled" "$OUT/.t" | tail -40; rm -f "$OUT/.t"; fi
if has ncu; then
  M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,launch__grid_size,launch__block_size,dram__bytes_read.sum,dram__bytes_write.sum
  for p in "copy bf16 268435456" "add bf16 268435456" "sum bf16 536870912" "row_sum bf16 65536 8192"; do
    section "ncu $p"
    ncu --clock-control none -k regex:kernel_cutlass --launch-skip 2 --launch-count 1 --metrics $M python3 -m perf.probe $p > "$OUT/.n" 2>&1
    cat "$OUT/.n" >> "$LOG"
    echo "ncu $p: $(grep -E "^\s+(gpu__time|dram__throughput|sm__warps|launch__registers|launch__grid)" "$OUT/.n" | awk '{printf "%s=%s ", $1, $NF}')"
  done
  # Small sizes: kernel duration of ours vs torch's (randn's two conversion kernels skipped).
  for p in "copy bf16 524288" "add bf16 524288" "add fp32 262144"; do
    for who in ours torch; do
      if [ $who = ours ]; then K=regex:kernel_cutlass; S=2; A=$p; else K=regex:elementwise; S=4; A="torch.$p"; fi
      section "ncu $who $p"
      ncu --clock-control none -k $K --launch-skip $S --launch-count 1 --metrics $M python3 -m perf.probe $A > "$OUT/.n" 2>&1
      cat "$OUT/.n" >> "$LOG"
      echo "ncu $who $p: $(grep -E "^\s+(gpu__time|dram__throughput|launch__registers|launch__grid|launch__block)" "$OUT/.n" | awk '{printf "%s=%s ", $1, $NF}')"
    done
  done
  rm -f "$OUT/.n"
fi
if has small; then section small; python3 -m perf.small --out "$OUT" > "$OUT/.s" 2>&1; cat "$OUT/.s" >> "$LOG"; grep "^|" "$OUT/.s"; rm -f "$OUT/.s"; fi
if has sanitize; then
  for p in "add bf16 1048579" "row_sum bf16 3 769" "sum fp32 1000003" "row_sum fp16 4096 7"; do
    for tool in memcheck racecheck; do
      section "sanitizer $tool $p"
      r=$(compute-sanitizer --tool $tool --report-api-errors no python3 -m perf.probe $p 2>&1 | tee -a "$LOG" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY" | tr '\n' ' ')
      echo "sanitizer $tool $p: ${r:-no summary line (see log)}"
    done
  done
fi
if ! has nobench; then
  Q=""; has quick && Q="--quick"
  section bench; python3 -m cute_kernels bench all $Q --out "$OUT" > "$OUT/.b" 2>&1; cat "$OUT/.b" >> "$LOG"
  grep -E "^\[(PASS|FAIL)\]|^\| (elementwise|reduction)|^ceilings|^\| (compiled|public|torch\.mul)|Error|error" "$OUT/.b" | cut -c1-220; rm -f "$OUT/.b"
fi

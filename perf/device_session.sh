#!/usr/bin/env bash
# One device call: fill the compile cache, run the GPU tests, optional tuning and ncu probes,
# then the benchmarks. Logs and results go to $OUT; a short summary is printed last.
#   bash perf/device_session.sh [tune] [ncu] [sanitize] [quick]
set -u
OUT=${OUT:-/tmp/ck_out}; mkdir -p "$OUT"
want() { case " $* " in *" $1 "*) return 0;; esac; return 1; }
ARGS=" $* "
python3 -m cute_kernels compile --all --sweep --jobs 16 > "$OUT/precompile.log" 2>&1; tail -1 "$OUT/precompile.log"
python3 -m pytest -q tests -m gpu -p no:cacheprovider > "$OUT/pytest.log" 2>&1; echo "pytest: $(tail -1 "$OUT/pytest.log")"
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -20
if [[ $ARGS == *" tune "* ]]; then python3 -m perf.tune --out "$OUT" > "$OUT/tune.log" 2>&1; tail -25 "$OUT/tune.log"; fi
if [[ $ARGS == *" ncu "* ]]; then
  M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,launch__grid_size,launch__block_size,dram__bytes_read.sum,dram__bytes_write.sum
  for p in "copy bf16 268435456" "add bf16 268435456" "sum bf16 536870912" "row_sum bf16 65536 8192"; do
    ncu --clock-control none -k regex:kernel_cutlass --launch-skip 2 --launch-count 1 --metrics $M python3 -m perf.probe $p > "$OUT/ncu_${p// /_}.log" 2>&1
    echo "ncu $p:"; grep -E "^\s+(gpu__|dram__|sm__|launch__)" "$OUT/ncu_${p// /_}.log" | awk '{print "   ", $1, $(NF-1), $NF}'
  done
fi
if [[ $ARGS == *" sanitize "* ]]; then
  for p in "add bf16 1048579" "row_sum bf16 3 769" "sum fp32 1000003" "row_sum fp16 4096 7"; do
    for tool in memcheck racecheck; do
      r=$(compute-sanitizer --tool $tool --report-api-errors no python3 -m perf.probe $p 2>&1 | grep -E "ERROR SUMMARY|ok" | tr '\n' ' ')
      echo "sanitizer $tool $p: $r"
    done
  done
fi
Q=""; [[ $ARGS == *" quick "* ]] && Q="--quick"
python3 -m cute_kernels bench all $Q --out "$OUT" > "$OUT/bench.log" 2>&1
grep -E "^\[(PASS|FAIL)\]|^\| (elementwise|reduction)|^ceilings|^\| (compiled|public|torch\.mul)" "$OUT/bench.log"

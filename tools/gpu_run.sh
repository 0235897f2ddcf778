#!/usr/bin/env bash
# One batched GPU session step on the lent H200: install the carried fla wheel, then run the
# named steps, each under its own timeout, logging to $OUT. Usage: tools/gpu_run.sh STEP...
# Steps: doctor, gnorm_tests, gnorm_bench, model_kda (kernel-fun bench --model kda; MODEL_ARGS
#        passes e.g. "--shape steps=8"), model_gdn, model_gdn_default (fla's own GatedDeltaNet heads: 6 x K=256, V=512), gdn_tests, gdn_bench, cconv_tests, cconv_bench,
#        delta_tests, kda_stage_tests, kda_tests, kda_bench, candidates,
#        gpu_tests (every GPU test, SHARDS processes at once; TEST_PATHS narrows),
#        fuzz (random calls of gdn and kda against the fp64 recurrence, tools/chain_fuzz.py; FUZZ_ARGS),
#        stages_cconv, stages_kda, stages_gdn, stages_gnorm (kernel-fun bench --stages FAMILY:
#        every config of every shipped kernel forced, checked against its stage reference, timed;
#        the delta scans are kda's and gdn's),
#        cconv_diag (tools/cconv_diag.py timed, then under Nsight Compute),
#        cconv_host (host cost against device time of the two forwards, tools/cconv_host.py),
#        model_idle (tools/model_idle.py: IDLE_FAMILY gdn|kda, IDLE_ARMS ours|fla|ours,fla),
#        gdn_forms (tools/gdn_forms.py: the split and fused forwards timed against each other),
#        gdn_host (where gdn's host time per call goes: tools/gdn_host.py; GDN_HOST_SHAPE="B=4,T=4096,HV=32"),
#        flashqla (installs the FlashQLA wheels carried in .whl_fq/ into /tmp/site_fq, on this step's
#        path only; runs tools/flashqla_probe.py, then the gdn bench's *_vs_flashqla cases:
#        FLASHQLA_CASES replaces the --case list; FLASHQLA_PROBE=0 skips the probe; STEP_TIMEOUT
#        applies to each of the two),
#        ncu_kda, ncu_gdn (Nsight Compute on the backward stage kernels, tools/stage_ncu.py;
#        NCU_ARGS replaces its arguments), kda_variants (the
#        shipped chain against fla's own chunk_kda and fp64; the one-anchor, score-gradient
#        and dv-from-A stage tests)
# candidates: the stage-level GPU tests that force every configuration, candidates included.
# STAGES_ARGS is passed to the stages_* steps (e.g. STAGES_ARGS="--kernel cconv.fwd" with stages_cconv alone).
# stages_ab: the A/B of a change against an older tree, in one call: AB_FAMILY's (default gdn)
#        --stages (with STAGES_ARGS) run from AB_OLD (default ab_old/src: `git archive REV src | (mkdir -p
#        ab_old && tar x -C ab_old)` before the call; untracked, so it travels; delete it before
#        committing) and from src, alternated old, new, ROUNDS times (default 2), a process each;
#        records $OUT/stages_ab_{old,new}_N.json. AB_ARGS="--family gdn --case NAME" runs that op bench
#        instead of the stages (each process tunes anew: no autotune entries are restored).
# KDA_CASES="--case prod_b16 ...", GDN_CASES, CCONV_CASES pick bench cases; KDA_TEST_K="..." is passed to pytest -k.
# bench_cases: BENCH_FAMILY=kda BENCH_CASES="prod_b16 varlen_16docs", a process per case (STEP_TIMEOUT each).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:src
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
T=${STEP_TIMEOUT:-300}
# Autotune results carried between device calls: Triton's on-disk autotune cache (fla's
# kernels and ours both use it; each entry is keyed by the Triton build, the GPU target, the
# kernel's source, the tuning key and the configs, so an edited kernel re-tunes). Every run
# returns its entries as one archive, $OUT/triton_autotune.tgz, after each step (the device
# tool returns a limited number of files, so not one file per entry); copy it to
# .triton_autotune.tgz (git-ignored) and pass that in `carry`. Only AUTOTUNE_CACHE=restore puts
# them back: for test calls. The tuning keys leave out B and T, so an entry made at a test's
# small shape would pick the configs of a production-shape bench, for fla's kernels and ours:
# bench records are made without it (tuned at their own first case, as a user's first step).
TC=$(python3 -c "from triton import knobs; print(knobs.cache.dir)" 2>/dev/null || echo "$HOME/.triton/cache")
if [ "${AUTOTUNE_CACHE:-}" = restore ]; then
  mkdir -p "$TC"
  [ -f .triton_autotune.tgz ] && tar xzf .triton_autotune.tgz -C "$TC" --skip-old-files
  echo "autotune cache: $(find "$TC" -name '*.autotune.json' | wc -l) entries in $TC"
fi
save_autotune() {
  (cd "$TC" 2>/dev/null && find . -name '*.autotune.json' -print0 | tar czf "$OUT/triton_autotune.tgz" --null -T -)
  [ "${COMPILE_CACHE:-}" = "" ] || save_compiled
}
# Compiled kernels carried too, with COMPILE_CACHE=restore (or =save to start one): of Triton's
# cache, what a cache hit reads (each kernel's metadata .json, its group file and its .cubin;
# Triton 3.6's compile() loads those and nothing else, the IR text stays behind), as one gzipped
# tar split into 15 MB parts (the device tool's per-file limit is 16 MiB), $OUT/compiled/part-aa,
# -ab, ... after each step; copy them to .triton_compiled/ (git-ignored) and pass that folder in
# `carry`. COMPILE_ONLY (a regex on kernel names) keeps only those. At most 3 parts (the carry's
# limit is 64 MiB); a larger cache is not returned. Entries are keyed by the kernel's source and
# its specialization, so an edited kernel recompiles. The group files hold absolute paths: the
# cache must sit at the same place on the next machine (the image's $HOME/.triton/cache). On
# 2026-12-02 every kda GPU test that calls fla cost 220-310 s in a fresh process, most of it
# compiling; the whole cache with IR was 13 parts.
if [ "${COMPILE_CACHE:-}" = restore ] && ls .triton_compiled/part-* >/dev/null 2>&1; then
  mkdir -p "$TC"
  cat .triton_compiled/part-* | tar xz -C "$TC" --skip-old-files --exclude='*.autotune.json'
  echo "compiled cache: $(find "$TC" -type f ! -name '*.autotune.json' | wc -l) files in $TC"
fi
save_compiled() {
  rm -rf "$OUT/compiled" && mkdir -p "$OUT/compiled"
  (cd "$TC" 2>/dev/null && find . -type f \( -name '*.json' -o -name '*.cubin' \) ! -name '*.autotune.json' \
    | { if [ -n "${COMPILE_ONLY:-}" ]; then grep -E "/[^/]*(${COMPILE_ONLY})[^/]*$"; else cat; fi; } \
    | tar cz -T - | split -b 15000000 - "$OUT/compiled/part-")
  local n
  n=$(ls "$OUT/compiled" | wc -l)
  if [ "$n" -gt 3 ]; then
    rm -rf "$OUT/compiled"
    echo "compiled cache: $n parts of 15 MB, over 3, not returned (COMPILE_ONLY narrows it)"
  else
    echo "compiled cache: $n parts returned"
  fi
}
# gpu_tests: every GPU test (TEST_PATHS, default tests/; or the ids listed in IDS_FILE) in SHARDS
# (default 12) pytest processes at once on the one GPU: most of a GPU test's time is compiling
# kernels (one CPU core each), fla's autotuning at tiny shapes and the fp64 references' launches,
# so processes overlap well. The ids are cut into contiguous runs weighted by the file's rough
# cost per test (neighbouring tests share compiled kernels). Tests matching SERIAL (a regex;
# default: the ones that need tens of GB) run after the others, in one process. One log per
# shard (-v -s: a line per test as it ends, and what the tests print), returned as one archive $OUT/gpu_tests_logs.tgz (the
# device tool returns few files), and a summary: passed / failed / skipped per shard, the
# failures by id.
run_sharded_tests() {
  local n=${SHARDS:-12} d="$OUT/shards" serial=${SERIAL:-over_2_31|at_production_shape}
  mkdir -p "$d"
  if [ -n "${IDS_FILE:-}" ]; then cp "$IDS_FILE" "$d/all"; else
    python3 -m pytest -m gpu --collect-only -q ${TEST_PATHS:-tests} 2>/dev/null | grep '::' > "$d/all"; fi
  grep -E "$serial" "$d/all" > "$d/serial" || true
  grep -vE "$serial" "$d/all" > "$d/ids" || true
  python3 - "$d" "$n" <<'PY'
import sys
d, n = sys.argv[1], int(sys.argv[2])
ids = open(f"{d}/ids").read().split()
cost = {"kda/test_chain": 30, "gdn/test_chain": 30, "kda/test_stage": 12, "delta/": 8, "gnorm/": 3}
w = [next((c for k, c in cost.items() if k in i), 5) for i in ids]
total, acc, shard = sum(w), 0, 0
outs = [open(f"{d}/shard-{j}", "w") for j in range(n)]
for i, c in zip(ids, w):
    if acc >= total * (shard + 1) / n and shard < n - 1:
        shard += 1
    outs[shard].write(i + "\n")
    acc += c
PY
  echo "$(wc -l < "$d/all") tests: $(wc -l < "$d/ids") in $n shards, then $(wc -l < "$d/serial") alone"
  local j
  run_shard() {
    mapfile -t ids < "$d/shard-$1"
    [ ${#ids[@]} -gt 0 ] || return 0
    timeout "$2" python3 -m pytest -m gpu -v -s -rfEs -p no:cacheprovider --durations=8 "${ids[@]}" \
      > "$OUT/gpu_tests-$1.log" 2>&1
  }
  for ((j = 0; j < n; j++)); do run_shard "$j" "$T" & done
  wait
  cp "$d/serial" "$d/shard-serial"
  run_shard serial "${SERIAL_TIMEOUT:-200}"
  res() { grep -cE "(^| )($1)( \(.*\))?( +\[ *[0-9]+%\])?\$" "$2"; }  # a test's result word (-v), not the summary's
  for j in $(seq 0 $((n - 1))) serial; do
    [ -f "$OUT/gpu_tests-$j.log" ] || continue
    local lg="$OUT/gpu_tests-$j.log"
    echo "shard $j: $(res PASSED "$lg") passed, $(res 'FAILED|ERROR' "$lg") failed, $(res SKIPPED "$lg") skipped of $(wc -l < "$d/shard-$j"); $(tail -1 "$lg")"
  done
  grep -hE '^(FAILED|ERROR) ' "$OUT"/gpu_tests-*.log | head -40
  (cd "$OUT" && tar czf gpu_tests_logs.tgz gpu_tests-*.log shards && rm -rf gpu_tests-*.log shards)
}
for step in "$@"; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case $step in
    doctor) timeout 120 python3 -m kernel_fun doctor ;;
    cconv_tests) timeout "$T" python3 -m pytest -m gpu tests/cconv -q -x -rs --durations=5 2>&1 | tee "$OUT/cconv_tests.log" | grep --line-buffered -vE "^\s*$" | tail -40 ;;
    cconv_runtime) timeout "$T" python3 -m pytest -m gpu tests/cconv/test_runtime_gpu.py -q -rs -s 2>&1 | tee "$OUT/cconv_runtime.log" | tail -40 ;;
    cconv_bench) timeout "$T" python3 -m kernel_fun bench --family cconv ${CCONV_CASES:-} --json "$OUT/cconv_bench.json" 2>&1 | tee "$OUT/cconv_bench.log" ;;
    delta_tests) timeout "$T" python3 -m pytest -m gpu tests/delta -q -x -rs 2>&1 | tee "$OUT/delta_tests.log" | tail -30 ;;
    kda_stage_tests) timeout "$T" python3 -m pytest -m gpu tests/kda/test_stage_kernels_gpu.py -q -x -rs 2>&1 | tee "$OUT/kda_stage_tests.log" | tail -30 ;;
    kda_tests) timeout "$T" python3 -m pytest -m gpu tests/kda/test_chain_gpu.py -q -rs -s ${KDA_TEST_K:+-k "$KDA_TEST_K"} 2>&1 | tee "$OUT/kda_tests.log" | tail -40 ;;
    kda_bench) timeout "$T" python3 -m kernel_fun bench --family kda ${KDA_CASES:-} --json "$OUT/kda_bench.json" 2>&1 | tee "$OUT/kda_bench.log" ;;
    candidates) timeout "$T" python3 -m pytest -m gpu -q -rs -s tests/kda/test_stage_kernels_gpu.py -k "one_anchor or gate_bwd or every_config" 2>&1 | tee "$OUT/candidates.log" | grep --line-buffered -E "^\[|passed|failed|Error" | tail -60 ;;
    kda_variants) timeout "$T" python3 -m pytest -m gpu -q -rs -s tests/kda/test_chain_gpu.py tests/kda/test_stage_kernels_gpu.py tests/delta/test_state_scan_bwd_gpu.py -k "against_fla_chunk_kda or one_anchor or dv_from_A or score_grad" 2>&1 | tee "$OUT/kda_variants.log" | grep --line-buffered -E "vs fp64|ref dA_log|anchor|passed|failed|Error" | tail -60 ;;
    ncu_kda|ncu_gdn) NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      # tools/stage_ncu.py: each kernel launched once with a forced configuration inside one NVTX
      # range; NCU_ARGS replaces the kernels / shape
      if [ "$step" = ncu_kda ]; then args=${NCU_ARGS:-kda --shape B=2 --kernel kda.wy_bwd --kernel kda.intra_bwd=BK128-HOIST_S0-w4-s1}
      else args=${NCU_ARGS:-gdn --shape B=4,T=4096,H=16,HV=32 --kernel gdn.wy_dv_bwd --kernel gdn.wy_dqk_bwd=BK64-BV64-w4-s2}; fi
      timeout "$T" "$NCU" --clock-control none --target-processes all --nvtx --nvtx-include "stage_ncu/" --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis python3 tools/stage_ncu.py $args 2>&1 | tee "$OUT/$step.txt" | grep --line-buffered -E "launched|==PROF==|==ERR|Duration|Throughput|Stall|Warp Cycles|Registers|Achieved Occupancy|Theoretical Occupancy|Issued|Eligible" | tail -120 ;;
    cconv_diag) timeout 200 python3 tools/cconv_diag.py "$OUT/cconv_diag.json" 2>&1 | tee "$OUT/cconv_diag.log"
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      timeout "$T" "$NCU" --clock-control none --kernel-name-base demangled -k regex:'copy|conv_fwd|conv_bwd|dw_reduce' --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,smsp__inst_executed.sum,lts__t_sector_hit_rate.pct python3 tools/cconv_diag.py --once > "$OUT/ncu_cconv.txt" 2>&1
      grep -E "launched|==ERR|  [a-z_]*(kernel|copy)|Duration|DRAM Throughput|dram__bytes|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issued Warp|Eligible Warps|No Eligible|Stall|inst_executed|hit_rate" "$OUT/ncu_cconv.txt" | head -150 ;;
    gnorm_streams) timeout "$T" python3 tools/gnorm_streams.py "$OUT/gnorm_streams.json" 2>&1 | tee "$OUT/gnorm_streams.log" | tail -30 ;;
    flashqla) # FlashQLA in a folder of its own, on the path of this step only: where flash_qla imports,
      # fla's own dispatch hands it the calls it takes and ours routes those to fla (docs/gdn.md),
      # which would change what other steps' tests and benches run
      python3 -m pip install -q --no-index --no-deps --target /tmp/site_fq .whl_fq/*.whl 2>&1 | tail -3
      # TileLang's TVM links libz3.so.4.15 (z3-solver 4.15): the carried z3 wheel is slimmed to one
      # copy of the library (libz3.so, what z3's Python loads; the carry's limit is 64 MiB), linked here
      [ -f /tmp/site_fq/z3/lib/libz3.so ] && ln -sf libz3.so /tmp/site_fq/z3/lib/libz3.so.4.15
      ( export PYTHONPATH=/tmp/site_fq:$PYTHONPATH LD_LIBRARY_PATH=/tmp/site_fq/z3/lib:${LD_LIBRARY_PATH:-}
        # FLASHQLA_PROBE=0 skips the probe (FlashQLA compiles its kernels anew in each process, ~90 s)
        [ "${FLASHQLA_PROBE:-1}" = 0 ] || timeout "$T" python3 tools/flashqla_probe.py 2>&1 | tee "$OUT/flashqla.log"
        timeout "$T" python3 -m kernel_fun bench --family gdn ${FLASHQLA_CASES:---case prod_b8_vs_flashqla --case grouped_h16_hv32_b4_vs_flashqla} \
          --json "$OUT/gdn_flashqla.json" 2>&1 | tee "$OUT/gdn_flashqla.log" ) ;;
    gdn_host) timeout "$T" python3 tools/gdn_host.py "$OUT/gdn_host.json" ${GDN_HOST_SHAPE:-} 2>&1 | tee "$OUT/gdn_host.log" | tail -60 ;;
    cconv_host) timeout "$T" python3 tools/cconv_host.py "$OUT/cconv_host.json" 2>&1 | tee "$OUT/cconv_host.log" | tail -30 ;;
    stages_ab)  # one family's --stages, the tree at AB_OLD (default ab_old/src) against src, alternated
      old=${AB_OLD:-ab_old/src}
      if [ ! -d "$old/kernel_fun" ]; then
        echo "no $old/kernel_fun: before the call, git archive REV src | (mkdir -p ab_old && tar x -C ab_old)"; continue; fi
      for r in $(seq 1 "${ROUNDS:-2}"); do
        for side in old new; do
          [ "$side" = old ] && tree=$old || tree=src
          echo "--- round $r, $side ($tree)"
          # AB_ARGS replaces the --stages arguments (e.g. "--family gdn --case grouped_h16_hv32_b4": the op)
          PYTHONPATH=/tmp/site:$tree timeout "$T" python3 -m kernel_fun bench ${AB_ARGS:---stages ${AB_FAMILY:-gdn} ${STAGES_ARGS:-}} \
            --json "$OUT/stages_ab_${side}_$r.json" 2>&1 | tee "$OUT/stages_ab_${side}_$r.log" | tail -40
        done
      done ;;
    stages_cconv|stages_kda|stages_gdn|stages_gnorm) fam=${step#stages_}
      timeout "$T" python3 -m kernel_fun bench --stages "$fam" ${STAGES_ARGS:-} --json "$OUT/stages_$fam.json" 2>&1 | tee "$OUT/stages_$fam.log" | tail -80 ;;
    model_idle) # where a model step's GPU idles and what the host does then (tools/model_idle.py);
      # IDLE_FAMILY gdn|kda (gdn), IDLE_ARMS ours,fla (ours)
      timeout "$T" python3 tools/model_idle.py "$OUT/model_idle.json" "${IDLE_FAMILY:-gdn}" "${IDLE_ARMS:-ours}" 2>&1 \
        | tee "$OUT/model_idle.log" | tail -80 ;;
    gnorm_tests) timeout "$T" python3 -m pytest -m gpu tests/gnorm -q -x -rs --durations=5 2>&1 | tee "$OUT/gnorm_tests.log" | tail -30 ;;
    gnorm_bench) timeout "$T" python3 -m kernel_fun bench --family gnorm --json "$OUT/gnorm_bench.json" 2>&1 | tee "$OUT/gnorm_bench.log" ;;
    model_kda|model_gdn|model_gdn_default) fam=${step#model_}
      # tuned at the model's own shapes: entries an earlier step left on this (warm) machine are
      # keyed without B and T and would be reused (2026-12-04: the GPU tests' picks cost the GDN
      # model 0.9 ms a step); AUTOTUNE_CACHE=restore keeps what it restored
      [ "${AUTOTUNE_CACHE:-}" = restore ] || find "$TC" -name '*.autotune.json' -delete 2>/dev/null
      timeout "$T" python3 -m kernel_fun bench --model "$fam" ${MODEL_ARGS:-} --json "$OUT/model_$fam.json" 2>&1 | tee "$OUT/model_$fam.log" ;;
    gdn_forms) # the split and fused forwards timed against each other (tools/gdn_forms.py; FORMS_SHAPES narrows)
      timeout "$T" python3 tools/gdn_forms.py "$OUT/gdn_forms.json" ${FORMS_SHAPES:-} 2>&1 | tee "$OUT/gdn_forms.log" | grep -v Warning ;;
    gdn_tests) timeout "$T" python3 -m pytest -m gpu tests/gdn -q -rs -s --durations=5 2>&1 | tee "$OUT/gdn_tests.log" | tail -30 ;;
    gpu_tests) run_sharded_tests ;;
    fuzz) # tools/chain_fuzz.py on the GPU (bf16, fla's own stages): FUZZ_FAMILIES (gdn kda), FUZZ_ARGS
      # (--layer --n 40: the layer's call at one head shape, few specializations); STEP_TIMEOUT each
      for f in ${FUZZ_FAMILIES:-gdn kda}; do
        timeout "$T" python3 tools/chain_fuzz.py "$f" --device cuda ${FUZZ_ARGS:---layer --n 40} 2>&1 | grep -v Warn \
          | tee "$OUT/fuzz_$f.log" | grep -v "^ok"
      done ;;
    gdn_bench) timeout "$T" python3 -m kernel_fun bench --family gdn ${GDN_CASES:-} --json "$OUT/gdn_bench.json" 2>&1 | tee "$OUT/gdn_bench.log" ;;
    bench_cases) # BENCH_FAMILY's cases named in BENCH_CASES ("prod_b16 varlen_16docs"), a process each,
      # each tuned at its own shape (the autotune entries deleted before it); the compiled kernels stay,
      # so the first case pays the compiles (2026-12-03, kda: 186 s and more fresh, 47-85 s after)
      for c in ${BENCH_CASES:?BENCH_CASES names the cases}; do
        find "$TC" -name '*.autotune.json' -delete 2>/dev/null
        echo "--- ${BENCH_FAMILY:?} $c ($(date -u +%H:%M:%S))"
        timeout "$T" python3 -m kernel_fun bench --family "$BENCH_FAMILY" --case "$c" \
          --json "$OUT/${BENCH_FAMILY}-$c.json" 2>&1 | tee "$OUT/${BENCH_FAMILY}-$c.log" | grep -v Warning
      done ;;
    *) echo "unknown step $step" ;;
  esac
  save_autotune
done
echo "=== done ($(date -u +%H:%M:%S))"

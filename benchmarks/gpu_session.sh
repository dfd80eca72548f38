#!/usr/bin/env bash
# One device-machine call: set up, run the GPU tests, the main job and the GEMM benchmark.
#   bash benchmarks/h100_session.sh [prebuild|tests|main|bench|quick|small|sweep|epilogue|fp8|grouped|overhead|model|torch|pdl|profile|sanitize]...
#   (default: prebuild tests main quick); TESTS="tests/test_x.py ..." narrows the tests step;
#   SWEEP_ARGS="--models llama3-8b ..." narrows the sweep, FP8_ARGS="--scalings blockwise ..." bench_fp8.py.
# Logs and results land in $OUT (the device tool brings them back). numba-cuda 0.30.4 needs
# NumPy < 2.5, and the tests step pytest-xdist: the wheels in .whl/ (carried with the call:
# numpy==2.4.6, expecttest, pytest-xdist, execnet) are installed into .site first.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1
steps=${*:-prebuild tests main quick}
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv
  python3 -c "import numpy, numba_cuda, cuda.core, cuda.bindings, torch; print('numpy', numpy.__version__, 'numba-cuda', numba_cuda.__version__, 'cuda.core', cuda.core.__version__, 'cuda.bindings', cuda.bindings.__version__, 'torch', torch.__version__)"
} 2>&1 | tee "$OUT/env.txt"
status=0
for step in $steps; do
  case $step in
    tests)  # compile-bound: GPU_WORKERS processes share the GPU, a file each; then the serial tests alone
      python3 -m pytest -m "gpu and not serial" -n "${GPU_WORKERS:-8}" --dist loadfile -q -rfEs -p no:cacheprovider \
        ${TESTS:-tests} 2>&1 | tee "$OUT/gpu-tests.log" | tail -30; status=$((status | PIPESTATUS[0]))
      python3 -m pytest -m "gpu and serial" -n 0 -q -rfEs -p no:cacheprovider ${TESTS:-tests} 2>&1 \
        | tee "$OUT/gpu-tests-serial.log" | tail -10; rc=${PIPESTATUS[0]}; [ "$rc" = 5 ] || status=$((status | rc)) ;;
    prebuild) python3 -m numba_hopper.prebuild --jobs "$(nproc)" 2>&1 | tail -2 ;;  # before tests: the default kernels, built in parallel
    fp8) python3 benchmarks/bench_fp8.py ${FP8_ARGS:-} --json "$OUT/fp8.json" 2>&1 | tee "$OUT/fp8.log" | tail -20 ;;
    grouped) python3 benchmarks/bench_grouped.py --json "$OUT/grouped.json" 2>&1 | tee "$OUT/grouped.log" | tail -20 ;;
    main) python3 -m numba_hopper 2>&1 | tee "$OUT/main.log" ;;
    quick) python3 benchmarks/bench_gemm.py --quick --json "$OUT/bench-quick.json" 2>&1 | tee "$OUT/bench-quick.log" ;;
    bench) python3 benchmarks/bench_gemm.py --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" ;;
    small) python3 benchmarks/bench_gemm.py --suite small --json "$OUT/bench-small.json" 2>&1 | tee "$OUT/bench-small.log" ;;
    epilogue) python3 benchmarks/bench_epilogue.py --json "$OUT/epilogue.json" 2>&1 | tee "$OUT/epilogue.log" ;;
    overhead) python3 benchmarks/bench_overhead.py --json "$OUT/overhead.json" 2>&1 | tee "$OUT/overhead.log" ;;
    model) python3 benchmarks/bench_model.py --json "$OUT/model.json" 2>&1 | tee "$OUT/model.log" ;;
    sweep) python3 benchmarks/bench_sweep.py ${SWEEP_ARGS:-} --json "$OUT/sweep.json" 2>&1 | tee "$OUT/sweep.log" ;;
    torch) python3 benchmarks/bench_torch.py --json "$OUT/torch.json" 2>&1 | tee "$OUT/torch.log" ;;
    pdl) python3 benchmarks/bench_pdl.py --json "$OUT/pdl.json" 2>&1 | tee "$OUT/pdl.log" | tail -10 ;;
    profile) python3 benchmarks/profile_overhead.py 2>&1 | tee "$OUT/profile.log" | head -60 ;;
    sanitize) bash benchmarks/sanitize.sh 2>&1 | tee "$OUT/sanitize.log" ;;
  esac
done
exit $status

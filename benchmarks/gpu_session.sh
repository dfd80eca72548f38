#!/usr/bin/env bash
# One device-machine call: set up, then the steps named (the GPU tests in two groups that each
# fit a 10-minute call, the soak, the main job, benchmarks).
#   bash benchmarks/gpu_session.sh [prebuild|tests-gemm|tests-rest|serial|soak|main|ab|quick|bench|fp8|attention|kit|train]...
# Logs and results land in $OUT (the device tool brings them back). numba-cuda 0.30.4 needs
# NumPy < 2.5: the wheels in .whl/ (numpy==2.4.6, expecttest; carried with the call) are
# installed into .site first. GPU_WORKERS processes share the GPU in the compile-bound test
# steps, tests dealt to them by file (GPU_DIST=loadfile) or one by one (GPU_DIST=load: the fp8
# files took 132 s on 16 workers, against more than 280 s by file); the tests marked serial
# (they time the host or order streams) run alone after them.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --upgrade --target .site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee "$OUT/env.txt"
# The GEMM's test files (kernels, call path, its torch layer) and everything else.
GEMM_TESTS="tests/test_gemm_gpu.py tests/test_epilogue_gpu.py tests/test_fp8_gpu.py tests/test_fp8_output_gpu.py
  tests/test_grouped_gpu.py tests/test_grouped_fp8_gpu.py tests/test_gated_gpu.py tests/test_gemm_batched_gpu.py
  tests/test_cluster_gpu.py tests/test_call_path_gpu.py tests/test_call_path_edges_gpu.py tests/test_torch_gpu.py"
pytest_group() {  # name, files...
  local name=$1; shift
  python3 -m pytest -m "gpu and not serial and not soak" -n "${GPU_WORKERS:-12}" --dist "${GPU_DIST:-loadfile}" -q -rfEs \
    -p no:cacheprovider "$@" 2>&1 | tee "$OUT/gpu-tests-$name.log" | tail -15
  return "${PIPESTATUS[0]}"
}
status=0
for step in ${*:-prebuild tests-gemm}; do
  case $step in
    prebuild) python3 -m numba_hopper prebuild --jobs "$(nproc)" 2>&1 | tail -2 ;;
    tests-gemm) pytest_group gemm $GEMM_TESTS; status=$((status | $?)) ;;
    tests-rest) pytest_group rest $(ls tests/test_*_gpu.py | grep -v -F -f <(tr ' ' '\n' <<<"$GEMM_TESTS" | grep .));
                status=$((status | $?)) ;;
    serial) python3 -m pytest -m "gpu and serial" -n 0 -q -rfEs -p no:cacheprovider tests 2>&1 \
              | tee "$OUT/gpu-tests-serial.log" | tail -8; rc=${PIPESTATUS[0]}; [ "$rc" = 5 ] || status=$((status | rc)) ;;
    soak) python3 -m pytest -m soak -n 0 -q -s -rfEs -p no:cacheprovider tests/test_soak_gpu.py 2>&1 \
            | tee "$OUT/soak.log" | tail -25; status=$((status | PIPESTATUS[0])); cp benchmarks/results/soak-*.json "$OUT/" ;;
    main) python3 -m numba_hopper 2>&1 | tee "$OUT/main.log" | tail -25 ;;
    ab) python3 benchmarks/ab_versions.py --out "$OUT/ab.json" 2>&1 | tee "$OUT/ab.log" | tail -12 ;;
    quick) python3 benchmarks/bench_gemm.py --quick --out "$OUT/gemm-quick.json" 2>&1 | tee "$OUT/gemm-quick.log" | tail -12 ;;
    bench) python3 benchmarks/bench_gemm.py --out "$OUT/gemm.json" 2>&1 | tee "$OUT/gemm.log" | tail -25 ;;
    fp8) python3 benchmarks/bench_fp8.py --out "$OUT/fp8.json" 2>&1 | tee "$OUT/fp8.log" | tail -20 ;;
    attention) python3 benchmarks/bench_attention.py --quick --out "$OUT/attention.json" 2>&1 | tee "$OUT/attention.log" | tail -30 ;;
    kit) python3 benchmarks/bench_kit_gemm.py --out "$OUT/kit-gemm.json" 2>&1 | tee "$OUT/kit-gemm.log" | tail -5 ;;
    train) python3 benchmarks/bench_train.py --quick --out "$OUT/train.json" 2>&1 | tee "$OUT/train.log" | tail -16 ;;
    *) echo "unknown step $step"; status=1 ;;
  esac
done
exit $status

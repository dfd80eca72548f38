#!/usr/bin/env bash
# compute-sanitizer's four tools over benchmarks/sanitize_gemm.py, each failing on any error.
#   bash benchmarks/sanitize.sh [memcheck racecheck synccheck initcheck]
# Prints one "== tool: PASS|FAIL (exit code)" line per tool and exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
tools=${*:-memcheck racecheck synccheck initcheck}
status=0
for tool in $tools; do
  # API errors off: host libraries probe driver entry points (cuGetProcAddress fails with
  # CUDA_ERROR_INVALID_VALUE dozens of times) and memcheck would count those as errors.
  opts=(--tool "$tool" --error-exitcode 1 --report-api-errors no --print-limit 20)
  # Only numba_hopper's kernels (the GEMM, its scratch copies): torch's are not ours to
  # check. Not for initcheck: it must see torch's kernels write the inputs, else it reports
  # every read of them as uninitialized.
  [ "$tool" = initcheck ] || opts+=(--kernel-name "regex=gemm_kernel|_copy_2d")
  "$SANITIZER" "${opts[@]}" python3 benchmarks/sanitize_gemm.py
  rc=$?
  echo "== $tool: $([ $rc -eq 0 ] && echo PASS || echo FAIL) (exit $rc)"
  status=$((status | rc))
done
exit $status

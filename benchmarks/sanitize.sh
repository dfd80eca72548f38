#!/usr/bin/env bash
# compute-sanitizer's four tools over benchmarks/sanitize_gemm.py, each failing on any error.
#   bash benchmarks/sanitize.sh [memcheck racecheck synccheck initcheck]
# Prints one "tool: PASS|FAIL (exit code)" line per tool and exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
tools=${*:-memcheck racecheck synccheck initcheck}
status=0
for tool in $tools; do
  # Only numba_hopper's kernels (the GEMM and its scratch copies): torch's are not ours to check.
  "$SANITIZER" --tool "$tool" --error-exitcode 1 --kernel-name "regex=gemm_kernel|_copy_2d" --print-limit 20 \
    python3 benchmarks/sanitize_gemm.py
  rc=$?
  echo "== $tool: $([ $rc -eq 0 ] && echo PASS || echo FAIL) (exit $rc)"
  status=$((status | rc))
done
exit $status

#!/usr/bin/env bash
# Fails, listing the files, when a tracked C++ file differs from .clang-format.
# Fix with: git ls-files '*.cc' '*.h' '*.inc' '*.cu' '*.cuh' | xargs clang-format -i
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files -z '*.cc' '*.h' '*.inc' '*.cu' '*.cuh' | xargs -0 clang-format --dry-run -Werror
echo "check-format: every C++ file matches .clang-format"

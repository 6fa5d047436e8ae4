#!/usr/bin/env bash
# Fails if a C++/CUDA source of the project is not formatted as .clang-format says.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-format >/dev/null
  else
    echo "check_format: clang-format is not installed; skipping the format check" >&2
    exit 0
  fi
fi
files=$(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh')
bad=()
for f in $files; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check_format: not formatted (run clang-format -i on them):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: $(echo "$files" | wc -w) files are formatted"

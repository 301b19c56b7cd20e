#!/usr/bin/env bash
# Lists the non-test C++ functions longer than --max_function_lines (150)
# and the non-test C++ files longer than --max_file_lines (1000), longest
# first: the size limits of issue 36, for anyone to check. Functions come
# from Universal Ctags' line and end fields (Debian's universal-ctags).
# Test files (*_test.cc, tests/, fuzz/), generated code and third_party/
# are left out.
#
#   bash scripts/code_size.sh [--max_function_lines=N] [--max_file_lines=N]
#
# Exit 0 when nothing is over either limit, 1 when something is, 2 for a
# bad argument or a missing ctags.
set -euo pipefail
cd "$(dirname "$0")/.."

max_function=150
max_file=1000
for arg in "$@"; do
  case "$arg" in
    --max_function_lines=*) max_function="${arg#*=}" ;;
    --max_file_lines=*) max_file="${arg#*=}" ;;
    *)
      echo "code_size: unknown argument '$arg'; expected" \
        "--max_function_lines=N or --max_file_lines=N" >&2
      exit 2
      ;;
  esac
done
for n in "$max_function" "$max_file"; do
  if ! [[ "$n" =~ ^[1-9][0-9]*$ ]]; then
    echo "code_size: '$n': expected a whole number of lines >= 1" >&2
    exit 2
  fi
done
if ! ctags --version 2>/dev/null | grep -q 'Universal Ctags'; then
  echo "code_size: Universal Ctags not found (apt-get install universal-ctags)" >&2
  exit 2
fi

mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' |
  grep -Ev '(_test\.cc$|^tests/|^fuzz/|^third_party/)')

echo "# Functions over $max_function lines (non-test code)"
echo "#  lines  function                          file:line"
functions=$(ctags --fields=+ne --kinds-C++=f --language-force=C++ -f - \
  "${files[@]}" 2>/dev/null |
  awk -F'\t' -v max="$max_function" '{
      line = ""; end = "";
      for (i = 4; i <= NF; ++i) {
        if ($i ~ /^line:/) line = substr($i, 6);
        if ($i ~ /^end:/) end = substr($i, 5);
      }
      if (line != "" && end != "" && end - line + 1 > max)
        printf "%8d  %-32s  %s:%s\n", end - line + 1, $1, $2, line;
    }' | sort -rn)
echo "${functions:-   (none)}"

echo "# Files over $max_file lines (non-test code)"
echo "#  lines  file"
long_files=$(wc -l "${files[@]}" | grep -v ' total$' |
  awk -v max="$max_file" '$1 > max {printf "%8d  %s\n", $1, $2}' | sort -rn)
echo "${long_files:-   (none)}"

[ -z "$functions" ] && [ -z "$long_files" ]

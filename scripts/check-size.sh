#!/usr/bin/env bash
# Size limits of product code (docs/architecture.md, Style): no source file
# over 700 lines, no function over 80 lines (from the line naming the
# function to its closing brace, as Universal Ctags measures it). Prints
# the offenders and exits 1 when there are any; --table prints every
# function over 60 lines too, longest first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MAX_FILE=700
MAX_FUNC=80
show=$MAX_FUNC
case "${1:-}" in
  --table) show=60 ;;
  -h | --help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "check-size.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac
command -v ctags >/dev/null || { echo "check-size.sh: needs Universal Ctags (apt-get install universal-ctags)" >&2; exit 2; }
dirs=(lib common util daemon worker model train tools client python/src)
mapfile -t files < <(git ls-files "${dirs[@]/%//*.c}" "${dirs[@]/%//*.h}" 2>/dev/null || true)
bad=0
for f in "${files[@]}"; do
  n=$(wc -l <"$f")
  if ((n > MAX_FILE)); then
    echo "file over $MAX_FILE lines: $f ($n)"
    bad=1
  fi
done
while IFS=$'\t' read -r len file name; do
  if ((len > MAX_FUNC)); then
    echo "function over $MAX_FUNC lines: $file $name ($len)"
    bad=1
  elif ((len > show)); then
    echo "function: $file $name ($len)"
  fi
done < <(ctags --fields=+ne --c-kinds=f -o - "${files[@]}" |
  awk -F'\t' '{l=0; e=0; for (i = 4; i <= NF; i++) { if ($i ~ /^line:/) l = substr($i, 6); if ($i ~ /^end:/) e = substr($i, 5) }
               if (e > 0) printf "%d\t%s\t%s\n", e - l + 1, $2, $1 }' | sort -rn)
if ((bad == 0)); then
  echo "check-size: ${#files[@]} files, none over $MAX_FILE lines, no function over $MAX_FUNC lines"
fi
exit $bad

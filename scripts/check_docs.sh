#!/usr/bin/env bash
# Docs and comments describe the code as it is, briefly. Fails on: a comment block of more than 8
# lines in src/ or include/, words that tell a history (old commits, scratch programs, "the
# issue", before -> after figures), a repository path in the docs or comments that git does not
# track, a README over 220 lines and a BENCHMARKS.md of 400 or more. Run by CI.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=0
fail() { echo "check_docs: $*"; bad=1; }

# 1. Comment blocks: at most 8 lines of // in a row (a longer why belongs in docs/).
while read -r where; do fail "$where: a comment block of more than 8 lines"; done < <(
  git ls-files 'src/*' 'include/*' | grep -E '\.(h|cpp|def|in)$' | while read -r f; do
    awk -v f="$f" '/^[ \t]*\/\// { n++; if (n == 9) print f ":" NR - 8; next } { n = 0 }' "$f"
  done)

# 2. History: the docs and the code's comments say what is, not how it got there.
docs=(README.md BENCHMARKS.md $(git ls-files 'docs/*.md'))
history='scratch (program|driver)|\bthe issue\b|\bsessions? [0-9]|\bcommit [0-9a-f]{7,}|\bused to (be|run|take)|\bwas (faster|slower) before'
arrows='[0-9][0-9.,]*( ?[a-zA-Z%/]+)? ?(->|→) ?[0-9][0-9.,]*( ?[a-zA-Z%/]+)?'
while read -r hit; do fail "$hit: history in the docs"; done < <(grep -nHiE "$history" "${docs[@]}" || true)
while read -r hit; do fail "$hit: a before -> after figure (say what is, with its command)"; done < <(grep -nHE "$arrows" "${docs[@]}" || true)
while read -r hit; do fail "$hit: history in a comment"; done < <(
  git ls-files 'src/*' 'include/*' 'tools/*' 'bench/*' | xargs grep -nHiE "//.*($history)" || true)
while read -r hit; do fail "$hit: a before -> after figure in a comment"; done < <(
  git ls-files 'src/*' 'include/*' 'tools/*' 'bench/*' | xargs grep -nHE "//.*$arrows" || true)

# 3. Paths: every repository path the docs and comments name exists.
tracked=$(git ls-files)
# A path exists when git tracks a file it names or begins ("docs/bench_" of docs/bench_SUITE.svg).
exists() { awk -v p="$1" 'index($0, p) == 1 { found = 1; exit } END { exit !found }' <<<"$tracked"; }
roots='(src|include|docs|tests|scripts|bench|examples|tools|cmake|fuzz|\.ci)'
while IFS=: read -r file line path; do
  exists "$path" || fail "$file:$line: names $path, which git does not track"
done < <({ grep -noE "\b$roots/[a-z0-9_./-]*[a-z0-9_/]" "${docs[@]}";
           git ls-files 'src/*' 'include/*' 'tools/*' 'bench/*' 'tests/*.cpp' | xargs grep -noE "//.*" |
             grep -oE "^[^:]+:[0-9]+:|\b$roots/[a-z0-9_./-]*[a-z0-9_/]" | awk '/:$/ { at = $0; next } { print at $0 }'; } |
         grep -vE ':(src|include|docs|tests|scripts|bench|examples|tools|cmake|fuzz|\.ci)/$' || true)

# 4. The README and BENCHMARKS.md stay short.
n=$(wc -l < README.md)
[ "$n" -le 220 ] || fail "README.md has $n lines (at most 220: details go to docs/)"
n=$(wc -l < BENCHMARKS.md)
[ "$n" -lt 400 ] || fail "BENCHMARKS.md has $n lines (under 400: tables, their commands and a line of why)"

[ "$bad" = 0 ] && echo "check_docs: comments, docs and paths are as they should be"
exit "$bad"

#!/usr/bin/env bash
# Checks the lock annotations (src/common/thread_annotations.h) with clang's thread-safety
# analysis: every C++ file of the project's own code in BUILD's compile_commands.json
# (src/, tools/, python/src/; not tests, not generated code) is parsed by clang++ with
# -fsyntax-only -Wthread-safety -Werror=thread-safety. Exit 1 with clang's messages when a
# guarded member is touched without its lock, a REQUIRES function is called without it, etc.
#
#   scripts/check_thread_safety.sh [BUILD]   (default: build; it must be configured)
# Needs clang++ (Debian: clang); installs nothing itself (scripts/install_deps.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
DB="$BUILD/compile_commands.json"
CLANG=${CLANGXX:-$(command -v clang++ || true)}
if [ -z "$CLANG" ]; then
  echo "check_thread_safety: clang++ not found (apt-get install clang)" >&2
  exit 2
fi
if [ ! -f "$DB" ]; then
  echo "check_thread_safety: $DB missing: configure the build first (cmake -S . -B $BUILD)" >&2
  exit 2
fi
python3 - "$DB" "$CLANG" "$(nproc)" <<'EOF'
import concurrent.futures, json, os, shlex, subprocess, sys

db, clang, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])
root = os.getcwd()
mine = ("src/", "tools/", "python/src/")
# gcc's flags that clang does not take, and the warnings other than the analysis (gcc's
# build already enforces -Wall -Wextra -Werror).
drop_exact = {"-Werror", "-Wall", "-Wextra", "-fno-semantic-interposition"}
cmds = []
for e in json.load(open(db)):
    f = os.path.relpath(os.path.join(e["directory"], e["file"]), root)
    if not f.startswith(mine) or f.endswith(("_test.cc", ".pb.cc")) or not f.endswith(".cc"):
        continue
    args = shlex.split(e["command"]) if "command" in e else e["arguments"]
    while args and (os.path.basename(args[0]) in ("ccache", "sccache")):
        args = args[1:]
    out, skip = [clang], False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or a in drop_exact or a.startswith("-fsanitize"):
            continue
        out.append(a)
    out += ["-fsyntax-only", "-Wno-everything", "-Wthread-safety", "-Werror=thread-safety"]
    cmds.append((f, e["directory"], out))

def run(c):
    f, d, argv = c
    p = subprocess.run(argv, cwd=d, capture_output=True, text=True)
    return f, p.returncode, p.stderr

bad = 0
with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
    for f, rc, err in ex.map(run, cmds):
        if rc != 0:
            bad += 1
            sys.stderr.write(f"== {f}\n{err}\n")
print(f"check_thread_safety: {len(cmds)} files, {bad} with errors")
sys.exit(1 if bad else 0)
EOF

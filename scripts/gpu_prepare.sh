#!/usr/bin/env bash
# Run on the CPU machine before a GPU is used (issue 37): downloads, as wheels, every distribution of
# scripts/gpu_wheels.txt (what the suite imports that the GPU image lacks: scripts/gpu_image_packages.txt), at the
# versions installed here (what CI tests), into a git-ignored folder that travels with the working tree (the device
# tool's `carry`, at most 64 MiB in all). Nothing is fetched on the GPU machine: scripts/gpu_suite.sh's first step
# installs the folder with pip --no-index --no-deps --target.
#
#   bash scripts/gpu_prepare.sh              # cp312 manylinux x86-64 wheels (the GPU image's Python) into .whl/
#   bash scripts/gpu_prepare.sh --local      # wheels for this interpreter into .whl-local/ (the dry run's:
#                                            #   bash scripts/gpu_suite.sh --dry-run installs them)
#   bash scripts/gpu_prepare.sh --dest DIR   # into DIR instead (its *.whl are replaced)
# A distribution without a wheel on the index (antlr4-python3-runtime is an sdist) is built here with
# `pip wheel --no-deps`; it must come out pure-python (py3-none-any), else the script stops. Over the limit
# (GPU_CARRY_LIMIT_MIB, default 64) the script fails with one line. GPU_WHEELS_LIST: another list (tests).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
LIMIT_MIB="${GPU_CARRY_LIMIT_MIB:-64}"
LIST="${GPU_WHEELS_LIST:-scripts/gpu_wheels.txt}"  # another list: tests
GPU_PY=3.12
mode=gpu
dest=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --local) mode=local ;;
    --dest) dest=${2:?--dest needs a folder}; shift ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "gpu_prepare: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [[ $mode == gpu ]]; then
  dest=${dest:-.whl}
  target=(--python-version "$GPU_PY" --implementation cp --abi "cp${GPU_PY/./}"
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
  what="cp${GPU_PY/./} manylinux x86-64"
else
  dest=${dest:-.whl-local}
  target=()
  what="this python ($("$PYTHON" -c 'import sys; print("cp%d%d" % sys.version_info[:2])'))"
fi

# name==version of each distribution, as installed here
pins_txt=$("$PYTHON" - "$LIST" <<'EOF'
import sys
from importlib import metadata

for line in open(sys.argv[1], encoding="utf-8"):
    name = line.split("#", 1)[0].strip()
    if name:
        try:
            print(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            sys.exit(f"gpu_prepare: {name} ({sys.argv[1]}) is not installed here: pip install {name}")
EOF
)
mapfile -t pins <<<"$pins_txt"

mkdir -p "$dest"
rm -f "$dest"/*.whl
log=$(mktemp)
trap 'rm -f "$log"' EXIT
pip_q=(-m pip --disable-pip-version-check -q)
for pin in "${pins[@]}"; do
  if ! "$PYTHON" "${pip_q[@]}" download --no-deps --only-binary=:all: "${target[@]}" -d "$dest" "$pin" >"$log" 2>&1; then
    # no wheel on the index: build one here, which is only portable when it is pure python
    before=$(ls "$dest")
    if ! "$PYTHON" "${pip_q[@]}" wheel --no-deps -w "$dest" "$pin" >>"$log" 2>&1; then
      echo "gpu_prepare: neither a wheel nor a build of $pin: $(tail -n 1 "$log")" >&2
      exit 1
    fi
    built=$(comm -13 <(echo "$before") <(ls "$dest") | grep '\.whl$' || true)
    if [[ -z $built || $built != *-none-any.whl ]]; then
      echo "gpu_prepare: $pin built into '${built:-nothing}', not a pure-python wheel: it would not install there" >&2
      exit 1
    fi
    echo "  built $built (no wheel of $pin on the index)"
  fi
done

wheels=("$dest"/*.whl)
bytes=$(cat "${wheels[@]}" | wc -c)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
if awk -v b="$bytes" -v l="$LIMIT_MIB" 'BEGIN { exit !(b > l * 1048576) }'; then
  echo "gpu_prepare: the ${#wheels[@]} wheels in $dest/ take $mib MiB, over the $LIMIT_MIB MiB the device tool carries" >&2
  exit 1
fi
echo "gpu_prepare: ${#wheels[@]} wheels for $what, $mib MiB in $dest/ (limit $LIMIT_MIB MiB for all that is carried):"
for w in "${wheels[@]}"; do
  printf '  %-60s %7s KiB\n' "$(basename "$w")" "$(($(wc -c <"$w") / 1024))"
done
if [[ $dest != /* ]] && ! git check-ignore -q "$dest/x.whl" 2>/dev/null; then
  echo "gpu_prepare: warning: $dest/ is not git-ignored (add it to .gitignore; the device tool carries ignored paths)"
fi
if [[ $mode == gpu ]]; then
  echo "send along: carry [\"${dest%/}\"]"
  echo "run there:  bash scripts/gpu_suite.sh   (WHEEL_DIR=${dest%/}; its first step installs the wheels, no network)"
else
  echo "dry run:    WHEEL_DIR=${dest%/} bash scripts/gpu_suite.sh --dry-run"
fi

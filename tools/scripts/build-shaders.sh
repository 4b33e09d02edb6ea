#!/usr/bin/env bash
# Compile the compute shaders: every shaders/NAME.comp (GLSL 450, one kernel a file) becomes
# shaders/NAME.spv, which is committed and embedded with include_bytes!, so building fulcrum
# needs no shader compiler. Each output is checked with spirv-val.
#
#   tools/scripts/build-shaders.sh          compile, update the .spv files that changed,
#                                           remove .spv files whose .comp is gone
#   tools/scripts/build-shaders.sh --check  change nothing; fail if a committed .spv is stale,
#                                           missing or orphaned, or does not validate (CI)
#
# The committed .spv must be byte-for-byte what this script produces with CI's glslc (Debian 12:
# packages glslc and spirv-tools). Shaders are compiled from inside shaders/ with a relative
# file name, so no checkout path can leak into the output. `#include "x.glsl"` resolves against
# shaders/ (files other than *.comp are not compiled on their own).
set -euo pipefail

TARGET_ENV=vulkan1.1

usage() {
    sed -n '2,10s/^# \{0,1\}//p' "$0"
}

mode=build
case "${1:-}" in
    "") ;;
    --check) mode=check ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
esac
if [ $# -gt 1 ]; then usage >&2; exit 2; fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir="$root/shaders"

shopt -s nullglob
comps=("$dir"/*.comp)
spvs=("$dir"/*.spv)
shopt -u nullglob

if [ ${#comps[@]} -eq 0 ] && [ ${#spvs[@]} -eq 0 ]; then
    echo "build-shaders: no shaders (shaders/*.comp): nothing to $mode"
    exit 0
fi

for tool in glslc spirv-val; do
    if ! command -v "$tool" >/dev/null; then
        echo "build-shaders: '$tool' not found; install the Debian packages glslc and spirv-tools" >&2
        exit 1
    fi
done
glslc_version=$(glslc --version)
glslc_version=${glslc_version%%$'\n'*} # first line; no `| head`, which can SIGPIPE glslc
echo "build-shaders: $glslc_version, target $TARGET_ENV, ${#comps[@]} shader(s)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Compile every kernel into $tmp and validate it there.
failed=0
for comp in "${comps[@]}"; do
    name=$(basename "$comp" .comp)
    if ! (cd "$dir" && glslc --target-env="$TARGET_ENV" -O -I . -o "$tmp/$name.spv" "$name.comp"); then
        echo "build-shaders: shaders/$name.comp does not compile" >&2
        failed=1
    elif ! spirv-val --target-env "$TARGET_ENV" "$tmp/$name.spv"; then
        echo "build-shaders: shaders/$name.comp compiles to SPIR-V that fails spirv-val" >&2
        failed=1
    fi
done
if [ $failed -ne 0 ]; then
    exit 1
fi

if [ "$mode" = build ]; then
    for comp in "${comps[@]}"; do
        name=$(basename "$comp" .comp)
        if cmp -s "$tmp/$name.spv" "$dir/$name.spv"; then
            echo "  unchanged shaders/$name.spv"
        else
            # Only rewrite what changed: a touched .spv makes cargo rebuild the crate embedding it.
            cp "$tmp/$name.spv" "$dir/$name.spv"
            echo "  wrote     shaders/$name.spv"
        fi
    done
    for spv in "${spvs[@]}"; do
        name=$(basename "$spv" .spv)
        if [ ! -e "$dir/$name.comp" ]; then
            rm -- "$spv"
            echo "  removed   shaders/$name.spv (no shaders/$name.comp)"
        fi
    done
    echo "build-shaders: done; commit shaders/*.spv together with shaders/*.comp"
    exit 0
fi

# --check: every committed .spv must validate and match a fresh compile.
problems=()
for spv in "${spvs[@]}"; do
    name=$(basename "$spv" .spv)
    if ! spirv-val --target-env "$TARGET_ENV" "$spv"; then
        problems+=("shaders/$name.spv fails spirv-val --target-env $TARGET_ENV")
    fi
    if [ ! -e "$dir/$name.comp" ]; then
        problems+=("shaders/$name.spv is an orphan: there is no shaders/$name.comp")
    fi
done
for comp in "${comps[@]}"; do
    name=$(basename "$comp" .comp)
    if [ ! -e "$dir/$name.spv" ]; then
        problems+=("shaders/$name.spv is missing (shaders/$name.comp was never compiled)")
    elif ! cmp -s "$tmp/$name.spv" "$dir/$name.spv"; then
        problems+=("shaders/$name.spv is stale: it differs from what shaders/$name.comp compiles to")
    fi
done

if [ ${#problems[@]} -ne 0 ]; then
    {
        echo "build-shaders --check: the committed SPIR-V does not match the shader sources:"
        printf '  - %s\n' "${problems[@]}"
        echo "Run tools/scripts/build-shaders.sh and commit the result (shaders/*.spv)."
        echo "The check compares bytes with the output of $glslc_version (Debian 12's glslc);"
        echo "another glslc version can produce different bytes."
    } >&2
    exit 1
fi
echo "build-shaders --check: ${#comps[@]} shader(s) fresh and valid"

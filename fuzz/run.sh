#!/usr/bin/env bash
# Runs every fuzz target for a bounded time: `fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]`
# (default 60 s, all targets). Needs cargo-fuzz (`cargo install cargo-fuzz`); works on the stable
# toolchain through RUSTC_BOOTSTRAP=1, which lets stable rustc accept the -Z flags cargo-fuzz
# passes (sanitizer coverage, AddressSanitizer). See docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(classify snapshot prom engine_codec registration fleet_config ext_proc convex)
fi
export RUSTC_BOOTSTRAP=1
for target in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$target"
    echo "== $target: ${seconds}s"
    # Debug assertions and overflow checks are on (cargo-fuzz's default build), so the
    # product's own debug_assert!s count as findings too.
    cargo fuzz run "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
        -max_total_time="$seconds" -dict="fuzz/dict/$target.dict" -print_final_stats=1
done

#!/usr/bin/env bash
# Generates the man pages of fluxd and fluxctl (fluxctl.1 and one page per subcommand, fluxctl.bench.1 ...) from
# their command definitions, with swift-argument-parser's generate-manual plugin (it comes with the package's
# swift-argument-parser dependency: nothing is fetched), and checks that each page renders (groff, when installed).
#
#   scripts/man.sh [OUTPUT_DIR]     (default .build/man; the directory is created; its old fluxd*/fluxctl* pages go)
#
# Environment: FLUXBUS_MAN_CONFIGURATION=debug|release (the plugin builds the package in that configuration first:
# incremental after `swift build` / `swift build -c release`; default debug), FLUXBUS_BUILD_LOCK=FILE (every swift
# command under flock(1) on FILE, as scripts/test.sh), SWIFT (default swift).
# The pages' date is the last commit's (reproducible), else today's.
set -euo pipefail
cd "$(dirname "$0")/.."

out="${1:-.build/man}"
configuration="${FLUXBUS_MAN_CONFIGURATION:-debug}"
swift="${SWIFT:-swift}"
if [ -n "${FLUXBUS_BUILD_LOCK:-}" ]; then swift_cmd=(flock "$FLUXBUS_BUILD_LOCK" "$swift"); else swift_cmd=("$swift"); fi
date="$(git log -1 --format=%cs 2>/dev/null || date +%F)"
plugin_out=.build/plugins/GenerateManual/outputs

rm -rf "$plugin_out/fluxd" "$plugin_out/fluxctl"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! "${swift_cmd[@]}" package plugin generate-manual --configuration "$configuration" --multi-page --date "$date" >"$log" 2>&1; then
    cat "$log" >&2
    echo "man.sh: swift package plugin generate-manual failed" >&2
    exit 1
fi

mkdir -p "$out"
rm -f "$out"/fluxd*.1 "$out"/fluxctl*.1
for tool in fluxd fluxctl; do
    [ -f "$plugin_out/$tool/$tool.1" ] || { echo "man.sh: the plugin made no $tool.1 (in $plugin_out/$tool)" >&2; exit 1; }
    cp "$plugin_out/$tool"/*.1 "$out"/
done
# The generator leaves a blank line between paragraphs of a discussion, which mdoc warns about: make each one a
# paragraph break (.Pp).
sed -i 's/^[[:space:]]*$/.Pp/' "$out"/fluxd*.1 "$out"/fluxctl*.1
for page in fluxd.1 fluxctl.1 fluxctl.bench.1 fluxctl.top.1; do
    [ -s "$out/$page" ] || { echo "man.sh: $out/$page is missing or empty" >&2; exit 1; }
done

# Render each page (mdoc) and fail on any groff warning or error.
if command -v groff >/dev/null 2>&1; then
    for page in "$out"/fluxd*.1 "$out"/fluxctl*.1; do
        problems="$(groff -mandoc -Tutf8 -ww -z "$page" 2>&1 || echo "groff exited with $?")"
        if [ -n "$problems" ]; then
            echo "man.sh: $page does not render cleanly:" >&2
            echo "$problems" >&2
            exit 1
        fi
    done
    rendered="rendered with groff"
else
    rendered="not rendered: groff is not installed"
fi
echo "man pages in $out ($(ls "$out"/fluxd*.1 "$out"/fluxctl*.1 | wc -l) pages, $rendered): view one with man -l $out/fluxctl.1"

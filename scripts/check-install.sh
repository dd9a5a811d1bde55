#!/usr/bin/env bash
# scripts/install.sh as a packager and a user meet it (issue 26), run by the README's test command:
#   1. DESTDIR staging of the system bus: binaries, man pages, completions, docs, example config, units;
#   2. --prefix DIR as a user that is not root (uid 65534 when this runs as root): everything but units, no root
#      needed; run twice, the second run changes nothing;
#   3. --help prints the usage; --units system as that user is refused (exit 1); a bad --units is exit 64.
#   scripts/check-install.sh BIN_DIR MAN_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:?usage: check-install.sh BIN_DIR MAN_DIR}" man="${2:?usage: check-install.sh BIN_DIR MAN_DIR}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "check-install: $*" >&2; exit 1; }
expect_files() { # root then relative paths
    local root="$1"; shift
    for f in "$@"; do [ -s "$root/$f" ] || fail "$f was not installed under $root"; done
}
common=(bin/fluxd bin/fluxd-exec bin/fluxctl share/man/man1/fluxd.1 share/man/man1/fluxctl.1 share/man/man1/fluxctl.top.1
        share/bash-completion/completions/fluxctl share/zsh/site-functions/_fluxctl share/fish/vendor_completions.d/fluxctl.fish
        share/doc/fluxbus/README.md share/doc/fluxbus/protocol/SPEC.md share/doc/fluxbus/docs/systemd.md
        share/doc/fluxbus/docs/configuration.md share/doc/fluxbus/examples/fluxd.toml)

# 1. Staged (a package build).
DESTDIR="$work/stage" bash scripts/install.sh --from "$bin" --man-from "$man" --prefix /usr/local --no-systemctl >/dev/null
expect_files "$work/stage/usr/local" "${common[@]}"
expect_files "$work/stage" etc/systemd/system/fluxd.service etc/systemd/system/fluxd.socket etc/sysusers.d/fluxbus.conf
grep -q "ExecStart=/usr/local/bin/fluxd" "$work/stage/etc/systemd/system/fluxd.service" || fail "the unit does not run /usr/local/bin/fluxd"
echo "check-install: DESTDIR staging installs binaries, man pages, completions, docs, the example config and the units"

# 2. A user's own prefix, not root. (As root without setpriv, or when uid 65534 cannot read the clone, e.g. under
# /root, it runs as root with --units none: never the system units, which root gets by default.)
as_user=() units=()
mkdir -p "$work/home"
if [ "$(id -u)" = 0 ]; then
    units=(--units none)
    if command -v setpriv >/dev/null 2>&1; then
        chmod 0777 "$work" "$work/home"
        if setpriv --reuid=65534 --regid=65534 --clear-groups test -r scripts/install.sh -a -x "$bin/fluxctl" 2>/dev/null; then
            as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups env HOME="$work/home")
            units=()
        fi
    fi
    [ ${#as_user[@]} -gt 0 ] || { echo "check-install: the user's prefix is checked as root (--units none)"; as_user=(env HOME="$work/home"); }
fi
out=$("${as_user[@]}" bash scripts/install.sh --prefix "$work/prefix" "${units[@]}" --from "$bin" --man-from "$man" 2>&1) ||
    fail "--prefix as a user that is not root failed: $out"
expect_files "$work/prefix" "${common[@]}"
[ ! -e "$work/prefix/etc" ] && [ ! -e "$work/home/.config/systemd" ] || fail "units were installed without --units"
echo "$out" | grep -q "units: none" || fail "the run did not say it installed no units: $out"
again=$("${as_user[@]}" bash scripts/install.sh --prefix "$work/prefix" "${units[@]}" --from "$bin" --man-from "$man" 2>&1)
echo "$again" | grep -q "Nothing changed" || fail "a second run changed something: $again"
echo "check-install: --prefix as uid $("${as_user[@]}" id -u) installs everything but units, and a second run changes nothing"

# 3. Usage.
bash scripts/install.sh --help | grep -q "^Usage: scripts/install.sh \[--prefix DIR\] \[--units system|user|none\]" || fail "--help prints no usage"
set +e
if [ "$("${as_user[@]}" id -u)" != 0 ]; then  # (as root it would install the system units: not here)
    "${as_user[@]}" bash scripts/install.sh --prefix "$work/prefix2" --units system --from "$bin" --man-from "$man" >/dev/null 2>"$work/err"
    status=$?
    [ "$status" = 1 ] && grep -q "run as root" "$work/err" || fail "--units system as a user that is not root: exit $status, $(cat "$work/err")"
fi
bash scripts/install.sh --units sometimes >/dev/null 2>&1
bad=$?
set -e
[ "$bad" = 64 ] || fail "--units sometimes: exit $bad, not 64"
echo "check-install: --help prints the usage; --units system needs root; a bad --units is a usage error"

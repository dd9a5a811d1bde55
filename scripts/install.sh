#!/usr/bin/env bash
# Installs FluxBus: fluxd (with fluxd-exec, which starts its workers), fluxctl, their man pages and shell
# completions, an example config, the docs, and (where asked) the systemd units. Usage: scripts/install.sh --help.
# Idempotent: a file already installed with the same contents is left alone; every step says what it did.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    cat <<'USAGE'
Usage: scripts/install.sh [--prefix DIR] [--units system|user|none] [--user] [--from DIR] [--man-from DIR]
                          [--no-systemctl]

Installs fluxd, fluxd-exec and fluxctl into PREFIX/bin, their man pages into PREFIX/share/man/man1, shell
completions (bash, zsh, fish) under PREFIX/share, an example config and the docs into PREFIX/share/doc/fluxbus,
and the systemd units where --units says.

  --prefix DIR     where everything but the units goes (default /usr/local as root, ~/.local otherwise or with
                   --user); no root is needed for a prefix you can write to
  --units KIND     system: /etc/systemd/system and the fluxbus user and group through sysusers.d (needs root);
                   user: ${XDG_CONFIG_HOME:-~/.config}/systemd/user; none: no units
                   (default: system as root, user with --user, none otherwise)
  --user           a user bus: --units user and --prefix ~/.local unless given
  --from DIR       take fluxd, fluxd-exec and fluxctl from DIR instead of building them (swift build -c release)
  --man-from DIR   take the man pages (fluxd.1, fluxctl*.1) from DIR instead of generating them (scripts/man.sh)
  --no-systemctl   do not run systemctl daemon-reload / systemd-sysusers (also when systemd is not running)
  -h, --help       this text

Environment: DESTDIR (stage under this root, for packaging: nothing is run then), SWIFT (default swift).
Afterwards (printed at the end): systemctl [--user] enable --now fluxd.socket. See docs/systemd.md.
USAGE
}

user=0 prefix="" from="" man_from="" run_systemctl=1 units=""
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ $# -ge 2 ] || { echo "install.sh: --prefix needs a directory" >&2; exit 64; }; prefix="$2"; shift 2 ;;
        --prefix=*) prefix="${1#--prefix=}"; shift ;;
        --units) [ $# -ge 2 ] || { echo "install.sh: --units needs system, user or none" >&2; exit 64; }; units="$2"; shift 2 ;;
        --units=*) units="${1#--units=}"; shift ;;
        --user) user=1; shift ;;
        --from) [ $# -ge 2 ] || { echo "install.sh: --from needs a directory" >&2; exit 64; }; from="$2"; shift 2 ;;
        --from=*) from="${1#--from=}"; shift ;;
        --man-from) [ $# -ge 2 ] || { echo "install.sh: --man-from needs a directory" >&2; exit 64; }; man_from="$2"; shift 2 ;;
        --man-from=*) man_from="${1#--man-from=}"; shift ;;
        --no-systemctl) run_systemctl=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown argument '$1'" >&2; usage >&2; exit 64 ;;
    esac
done
case "$units" in
    "") if [ "$user" = 1 ]; then units=user; elif [ "$(id -u)" = 0 ] || [ -n "${DESTDIR:-}" ]; then units=system; else units=none; fi ;;
    system|user|none) ;;
    *) echo "install.sh: --units must be system, user or none, got '$units'" >&2; exit 64 ;;
esac
[ "$units" = user ] && user=1

destdir="${DESTDIR:-}"
if [ -n "$destdir" ]; then run_systemctl=0; fi
if [ "$(id -u)" = 0 ] || [ -n "$destdir" ]; then default_prefix=/usr/local; else default_prefix="${HOME:-/nonexistent}/.local"; fi
if [ "$user" = 1 ]; then
    : "${HOME:?install.sh --user needs HOME}"
    prefix="${prefix:-$HOME/.local}"
else
    prefix="${prefix:-$default_prefix}"
fi
case "$units" in
    user) unitdir="${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"; units_from=contrib/systemd/user ;;
    system)
        unitdir=/etc/systemd/system; units_from=contrib/systemd
        if [ -z "$destdir" ] && [ "$(id -u)" != 0 ]; then
            echo "install.sh: --units system installs into $unitdir and creates the fluxbus user: run as root (or use --units user or none)" >&2
            exit 1
        fi ;;
    none) unitdir=""; units_from="" ;;
esac
case "$prefix" in /*) ;; *) echo "install.sh: --prefix must be an absolute path, got '$prefix'" >&2; exit 64 ;; esac
bindir="$prefix/bin"
docdir="$prefix/share/doc/fluxbus"
mandir="$prefix/share/man/man1"

# The binaries: built here in release mode, or taken as they are.
if [ -z "$from" ]; then
    swift="${SWIFT:-swift}"
    echo "==> $swift build -c release --product fluxd / fluxd-exec / fluxctl"
    for product in fluxd fluxd-exec fluxctl; do
        "$swift" build -c release --product "$product" >/dev/null
    done
    from="$("$swift" build -c release --show-bin-path)"
    built_release=1
fi
for exe in fluxd fluxd-exec fluxctl; do
    [ -x "$from/$exe" ] || { echo "install.sh: $from/$exe is missing or not executable" >&2; exit 1; }
done

# The man pages: generated from the command definitions (in the configuration just built), or taken as they are.
if [ -z "$man_from" ]; then
    man_from="$(mktemp -d)"
    trap 'rm -rf "$man_from"' EXIT
    echo "==> scripts/man.sh (man pages from the command definitions)"
    configuration=debug
    [ -z "${built_release:-}" ] || configuration=release
    FLUXBUS_MAN_CONFIGURATION=$configuration bash scripts/man.sh "$man_from" >/dev/null
fi
for page in fluxd.1 fluxctl.1; do
    [ -f "$man_from/$page" ] || { echo "install.sh: $man_from/$page is missing" >&2; exit 1; }
done

changed=0
# install_file SRC DEST MODE: installs (creating directories) unless DEST already has SRC's contents and mode.
install_file() {
    local src="$1" dest="$destdir$2" mode="$3"
    if [ -f "$dest" ] && cmp -s "$src" "$dest" && [ "$(stat -c %a "$dest")" = "${mode#0}" ]; then
        echo "    unchanged  $2"
        return
    fi
    local verb=installed
    [ -e "$dest" ] && verb=updated
    install -D -m "$mode" "$src" "$dest"
    echo "    $verb  $2"
    changed=1
}

# install_unit SRC DEST: a unit with its binary paths pointed at $bindir.
install_unit() {
    local src="$1" dest="$2" tmp
    tmp="$(mktemp)"
    sed -e "s#/usr/local/bin/#$bindir/#g" -e "s#%h/.local/bin/#$bindir/#g" \
        -e "s#file:///usr/local/share/doc/fluxbus/#file://$docdir/#g" "$src" >"$tmp"
    install_file "$tmp" "$dest" 0644
    rm -f "$tmp"
}

echo "==> binaries into $destdir$bindir"
install_file "$from/fluxd" "$bindir/fluxd" 0755
install_file "$from/fluxd-exec" "$bindir/fluxd-exec" 0755
install_file "$from/fluxctl" "$bindir/fluxctl" 0755

echo "==> man pages into $destdir$mandir"
for page in "$man_from"/fluxd*.1 "$man_from"/fluxctl*.1; do
    install_file "$page" "$mandir/$(basename "$page")" 0644
done

echo "==> shell completions into $destdir$prefix/share"
completions="$(mktemp -d)"
"$from/fluxctl" completions bash >"$completions/fluxctl.bash"
"$from/fluxctl" completions zsh >"$completions/_fluxctl"
"$from/fluxctl" completions fish >"$completions/fluxctl.fish"
install_file "$completions/fluxctl.bash" "$prefix/share/bash-completion/completions/fluxctl" 0644
install_file "$completions/_fluxctl" "$prefix/share/zsh/site-functions/_fluxctl" 0644
install_file "$completions/fluxctl.fish" "$prefix/share/fish/vendor_completions.d/fluxctl.fish" 0644
rm -rf "$completions"

if [ "$units" != none ]; then
    echo "==> units into $destdir$unitdir"
    install_unit "$units_from/fluxd.service" "$unitdir/fluxd.service"
    install_unit "$units_from/fluxd.socket" "$unitdir/fluxd.socket"
else
    echo "==> units: none (--units system or user installs them)"
fi

echo "==> docs and an example config into $destdir$docdir"
install_file README.md "$docdir/README.md" 0644
install_file LICENSE "$docdir/LICENSE" 0644
install_file protocol/SPEC.md "$docdir/protocol/SPEC.md" 0644
for doc in docs/*.md; do install_file "$doc" "$docdir/$doc" 0644; done
install_file examples/fluxd.toml "$docdir/examples/fluxd.toml" 0644

if [ "$units" = system ]; then
    echo "==> the fluxbus user and group"
    install_file contrib/systemd/fluxbus.sysusers /etc/sysusers.d/fluxbus.conf 0644
    if [ "$run_systemctl" = 1 ]; then
        if getent passwd fluxbus >/dev/null; then
            echo "    exists     user fluxbus"
        elif command -v systemd-sysusers >/dev/null; then
            systemd-sysusers /etc/sysusers.d/fluxbus.conf
            echo "    created    user and group fluxbus (systemd-sysusers)"
        else
            getent group fluxbus >/dev/null || groupadd --system fluxbus
            useradd --system --gid fluxbus --home-dir /var/lib/fluxbus --no-create-home --shell /usr/sbin/nologin fluxbus
            echo "    created    user and group fluxbus (useradd)"
        fi
    else
        echo "    skipped    creating user fluxbus (DESTDIR or --no-systemctl)"
    fi
fi

systemctl_cmd=(systemctl)
[ "$user" = 1 ] && systemctl_cmd=(systemctl --user)
if [ "$run_systemctl" = 1 ] && [ "$changed" = 1 ] && [ "$units" != none ]; then
    if command -v systemctl >/dev/null && [ -d /run/systemd/system ] && "${systemctl_cmd[@]}" daemon-reload 2>/dev/null; then
        echo "==> ${systemctl_cmd[*]} daemon-reload: done"
    else
        echo "==> ${systemctl_cmd[*]} daemon-reload: skipped (systemd is not running here)"
    fi
fi

echo
if [ "$changed" = 0 ]; then echo "Nothing changed: everything was installed already."; fi
echo "Next:"
if [ "$units" = none ]; then
    echo "    $bindir/fluxd &                                 # the default socket: \$XDG_RUNTIME_DIR/fluxbus/fluxd.sock"
    echo "    $bindir/fluxctl stores"
    echo "    example config: $docdir/examples/fluxd.toml (fluxd --config FILE); docs: $docdir"
    exit 0
fi
echo "    ${systemctl_cmd[*]} enable --now fluxd.socket     # fluxd starts on the first connection"
echo "    ${systemctl_cmd[*]} status fluxd.socket fluxd.service"
if [ "$user" = 1 ]; then
    echo "    $bindir/fluxctl stores                          # the default socket is \$XDG_RUNTIME_DIR/fluxbus/fluxd.sock"
else
    echo "    FLUXBUS_SOCKET=/run/fluxbus/fluxd.sock FLUXBUS_SERVER_UID=\$(id -u fluxbus) $bindir/fluxctl stores"
    echo "    (users in group fluxbus may connect: usermod -aG fluxbus NAME)"
fi
echo "    docs: $docdir (docs/systemd.md); man fluxctl, man fluxctl.top (man pages in $mandir)"

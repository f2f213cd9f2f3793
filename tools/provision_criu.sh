#!/usr/bin/env bash
# Provide CRIU >= 4.1 and its Python bindings (pycriu) to this checkout.
#
#   tools/provision_criu.sh VENV_PYTHON
#
# Uses the system's criu when it is >= 4.1 and `criu check` passes.
# Otherwise (Debian 12's criu 3.17 fails on kernels >= 6.13: "Unexpected rt
# vDSO area bounds") it fetches Debian 13's criu, the libraries it links and
# python3-pycriu from the Debian package registry and unpacks them into
# .prism/criu/ — a private apt state, no change to the system's package
# sources or libraries.  .prism/criu/bin/criu runs that criu on those
# libraries (through their own dynamic loader), and a .pth file makes
# pycriu importable in the virtual environment.  Idempotent: a second call
# that finds a working .prism/criu/bin/criu only re-links pycriu.
set -euo pipefail

python=${1:?usage: $0 VENV_PYTHON}
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=$root/.prism/criu
wrapper=$prefix/bin/criu
suite=${PRISM_CRIU_SUITE:-trixie}
mirror=${PRISM_CRIU_MIRROR:-http://deb.debian.org/debian}

say() { echo "provision_criu: $*" >&2; }

version_ok() {  # "Version: 4.1.1" -> 4.1 or newer
    "$1" --version 2>/dev/null | awk '/^Version:/ { split($2, v, "."); exit !(v[1] > 4 || (v[1] == 4 && v[2] >= 1)) }'
}

link_pycriu() {  # $1: the directory holding the pycriu package
    local site
    site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$1" > "$site/prism-criu.pth"
    "$python" -c 'import pycriu' || { say "pycriu does not import from $1"; exit 1; }
}

if [[ -x $wrapper ]] && version_ok "$wrapper"; then
    link_pycriu "$(cat "$prefix/pycriu-path")"
    exit 0
fi

mkdir -p "$prefix/bin"
system=$(command -v criu || true)
if [[ -n $system ]] && version_ok "$system" && "$system" check >/dev/null 2>&1 \
        && python3 -c 'import pycriu' 2>/dev/null; then
    say "using the system's $("$system" --version | head -1) at $system"
    printf '#!/bin/sh\nexec %q "$@"\n' "$system" > "$wrapper"
    chmod +x "$wrapper"
    python3 -c 'import os, pycriu; print(os.path.dirname(os.path.dirname(pycriu.__file__)))' \
        > "$prefix/pycriu-path"
    link_pycriu "$(cat "$prefix/pycriu-path")"
    exit 0
fi

say "fetching criu and python3-pycriu from Debian $suite into $prefix …"
apt_dir=$prefix/apt
rm -rf "$apt_dir" "$prefix/root"
mkdir -p "$apt_dir/state/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs" \
    "$prefix/root"
touch "$apt_dir/state/status"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" \
    > "$apt_dir/sources.list"
apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
          -o "Dir::State=$apt_dir/state" -o "Dir::State::status=$apt_dir/state/status"
          -o "Dir::Cache=$apt_dir/cache" -o "APT::Architecture=amd64"
          -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
apt-get "${apt_opts[@]}" -qq update
# criu and everything it links, down to the C library (Debian 13's criu needs
# glibc 2.38; Debian 12 has 2.36), and the pure-Python bindings
packages=$(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests \
               --no-conflicts --no-breaks --no-replaces --no-enhances criu \
           | grep -v '^ ' | grep -v '^<' | sort -u)
(cd "$apt_dir/debs" && apt-get "${apt_opts[@]}" -qq download $packages python3-pycriu)
for deb in "$apt_dir/debs"/*.deb; do
    dpkg-deb -x "$deb" "$prefix/root"
done
libs=$prefix/root/usr/lib/x86_64-linux-gnu
cat > "$wrapper" <<EOF
#!/bin/sh
# Debian $suite's criu on its own libraries (written by tools/provision_criu.sh)
exec "$libs/ld-linux-x86-64.so.2" --library-path "$libs" "$prefix/root/usr/sbin/criu" "\$@"
EOF
chmod +x "$wrapper"
rm -rf "$apt_dir"
echo "$prefix/root/usr/lib/python3/dist-packages" > "$prefix/pycriu-path"
version_ok "$wrapper" || { say "the unpacked criu does not run: $("$wrapper" --version 2>&1)"; exit 1; }
link_pycriu "$(cat "$prefix/pycriu-path")"
say "$("$wrapper" --version | head -1) in $prefix; criu check: $("$wrapper" check 2>&1 | tail -1)"

#!/usr/bin/env bash
# What `meson install` gives a user, checked from a staged copy (DESTDIR): the library, header
# and pkg-config file (a tiny program built with `pkg-config --cflags --libs kvtier` and run),
# the tools, and the Python package (imported from where it was installed, finding the library
# without KVTIER_LIBRARY); then `pip install ./python` into a virtual environment.
# usage: install_test.sh BUILD_DIR SOURCE_DIR [PYTHON]   (PYTHON: the interpreter meson found)
set -euo pipefail
build=$1 src=$2 py=${3:-}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
fail() { echo "install_test: $*" >&2; exit 1; }

meson install -C "$build" --no-rebuild --destdir "$stage" --quiet >/dev/null
pc=$(find "$stage" -name kvtier.pc -print -quit)
[ -n "$pc" ] || fail "no kvtier.pc installed"
export PKG_CONFIG_PATH=$(dirname "$pc")
prefix=$(pkg-config --variable=prefix kvtier)
libdir=$(pkg-config --variable=libdir kvtier)
flags=$(pkg-config --define-variable=prefix="$stage$prefix" --cflags --libs kvtier)
echo "pkg-config: $flags"
[ -f "$stage$prefix/include/kvtier.h" ] || fail "kvtier.h not installed"
cc -std=c11 -Wall -Werror "$src/tests/install/hello.c" $flags -o "$stage/hello"
LD_LIBRARY_PATH="$stage$libdir" "$stage/hello"

for tool in kvtier-demo kvtier-bench kvtier-replay kvtier-curve kvtier-trace; do
	[ -x "$stage$prefix/bin/$tool" ] || fail "$tool not installed"
	LD_LIBRARY_PATH="$stage$libdir" "$stage$prefix/bin/$tool" --help >/dev/null
done
echo "tools: installed and answer --help"

[ -n "$py" ] || py=$(command -v python3 || true)
[ -n "$py" ] || { echo "install_test: no python3, Python checks skipped"; exit 0; }
init=$(find "$stage" -path '*/kvtier/__init__.py' -print -quit)
[ -n "$init" ] || fail "Python package not installed"
site=$(dirname "$(dirname "$init")")
grep -q "LIBDIR = \"$libdir\"" "$site/kvtier/_install.py" || fail "_install.py does not name $libdir"
# Where the prefix is the interpreter's own (its sys.prefix, or /usr/local on Debian), the
# package must land in one of its site directories (which site adds once they exist).
"$py" - "$prefix" "${site#"$stage"}" <<'PY' || fail "package not installed where $py looks"
import site, sys, sysconfig
prefix, where = sys.argv[1], sys.argv[2]
own = prefix == sys.prefix or (prefix == "/usr/local" and
                               sysconfig.get_default_scheme() == "posix_local")
if own and where not in site.getsitepackages():
    sys.exit(f"install_test: {where} is not among {sys.executable}'s site directories "
             f"{site.getsitepackages()}")
print(f"python: package installed to {where}" +
      ("" if own else f" (prefix {prefix} is not {sys.executable}'s: needs PYTHONPATH)"))
PY
"$py" -c 'import numpy' 2>/dev/null || { echo "install_test: no numpy, import skipped"; exit 0; }
export GLIBC_TUNABLES=glibc.rtld.optional_static_tls=4096
unset KVTIER_LIBRARY
# The staged library stands where _install.LIBDIR will point once installed for real.
LD_LIBRARY_PATH="$stage$libdir" PYTHONPATH="$site" "$py" - "$stage" <<'PY'
import sys
import kvtier
assert kvtier.__file__.startswith(sys.argv[1]), kvtier.__file__
with kvtier.Manager(n_layers=1, backend="host", device_bytes=64 << 20, host_bytes=64 << 20) as m:
    print(f"python: kvtier {kvtier.version()} imported from {kvtier.__file__}, "
          f"backend {m.config.backend.name}")
PY

# pip install ./python, offline (Debian's setuptools; no download)
if "$py" -c 'import venv, ensurepip' 2>/dev/null || "$py" -m pip --version >/dev/null 2>&1; then
	"$py" -m venv --system-site-packages "$stage/venv" >/dev/null 2>&1 ||
		{ echo "install_test: no venv, pip check skipped"; exit 0; }
	# An interpreter that is itself a virtual environment's (the PyTorch one of a GPU machine):
	# the new venv's system packages are its base interpreter's, not its own, so pip would look
	# for NumPy on the network. A .pth file hands the new venv the outer one's site directories.
	if "$py" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
		purelib=$("$stage/venv/bin/python" -c \
			'import sysconfig; print(sysconfig.get_path("purelib"))')
		"$py" -c 'import site; print("\n".join(site.getsitepackages()))' \
			> "$purelib/outer-venv.pth"
	fi
	cp -r "$src/python" "$stage/pysrc"
	"$stage/venv/bin/python" -m pip install --quiet --no-build-isolation --no-index \
		"$stage/pysrc" || fail "pip install ./python failed"
	cd "$stage"
	KVTIER_LIBRARY="$stage$libdir/libkvtier.so.0" "$stage/venv/bin/python" -c \
		'import kvtier, sys; assert "venv" in kvtier.__file__; print("pip: kvtier", kvtier.version(), "from", kvtier.__file__)'
else
	echo "install_test: no pip, pip check skipped"
fi
echo "install_test: ok"

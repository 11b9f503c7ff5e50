#!/bin/sh
# Installs the edgefl device agent from this bundle (edgefl @VERSION@, @TARGET@), offline:
#   - PREFIX/bin/edgefl-device, the native agent, which runs the bundled native trainer (edgefl-et-train)
#     each round: no Python needed;
#   - only when the bundle carries wheels/ ('edgefl device bundle --with-python'): a virtual environment
#     PREFIX/venv with the system python3 and those wheels (no index, no torch), for the Python tools;
#   - as root, also: the system user 'edgefl', /etc/edgefl/device.env (kept if present) and
#     /etc/systemd/system/edgefl-device.service (not enabled: edit device.env first).
# PREFIX defaults to the folder this script is in; PREFIX=/elsewhere ./install.sh copies bin/ and lib/ there.
# PYTHON picks the interpreter for the wheels (default python3).
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
PREFIX=${PREFIX:-$HERE}
PYTHON=${PYTHON:-python3}
SERVICE_USER=${SERVICE_USER:-edgefl}

fail() { echo "install.sh: error: $*" >&2; exit 1; }

machine=$(uname -m)
[ "$machine" = "@MACHINE@" ] || fail "this bundle is for @MACHINE@ (@TARGET@) and this machine is $machine; on a Raspberry Pi use the 64-bit Raspberry Pi OS (bookworm)"

if command -v sha256sum >/dev/null 2>&1; then
    (cd "$HERE" && sha256sum --check --quiet SHA256SUMS) || fail "the bundle's files do not match SHA256SUMS: unpack a fresh copy"
fi

if [ "$PREFIX" != "$HERE" ]; then
    mkdir -p "$PREFIX/bin" "$PREFIX/lib"
    cp "$HERE/bin/edgefl-device" "$HERE/bin/edgefl-et-train" "$PREFIX/bin/"
    cp "$HERE"/lib/*.so "$PREFIX/lib/"
fi
PREFIX=$(cd "$PREFIX" && pwd)
"$PREFIX/bin/edgefl-device" --help >/dev/null 2>&1 || fail "$PREFIX/bin/edgefl-device does not run here: it needs OpenSSL 3 (libssl3, in Raspberry Pi OS bookworm); install it with: sudo apt install libssl3"
echo "installed $PREFIX/bin/edgefl-device (the native agent); see its flags with: $PREFIX/bin/edgefl-device --help"

if [ -d "$HERE/wheels" ]; then
    command -v "$PYTHON" >/dev/null 2>&1 || fail "$PYTHON not found (the bundle's wheels need it); install it with: sudo apt install python3 python3-venv"
    "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || fail "$PYTHON cannot create virtual environments; install it with: sudo apt install python3-venv"
    version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [ "$version" = "@PYTHON_VERSION@" ] || echo "install.sh: warning: the bundle's compiled wheels (numpy, pydantic-core, pyyaml) are for Python @PYTHON_VERSION@ and $PYTHON is $version; pip will fail unless wheels for $version are added to wheels/" >&2
    echo "creating $PREFIX/venv with $PYTHON ($version) for the Python tools"
    "$PYTHON" -m venv "$PREFIX/venv"
    "$PREFIX/venv/bin/pip" install --quiet --no-index --find-links "$HERE/wheels" edgefl
    # the bundle's own edgefl, even when a venv from an earlier bundle holds the same version number
    "$PREFIX/venv/bin/pip" install --quiet --no-index --no-deps --force-reinstall "$HERE"/wheels/edgefl-*.whl
fi

if [ "$(id -u)" != 0 ]; then
    echo "not root: the service was not installed (run 'sudo $0' for the edgefl-device systemd service)"
    exit 0
fi

if ! id "$SERVICE_USER" >/dev/null 2>&1; then
    useradd --system --home-dir /var/lib/edgefl --no-create-home --shell /usr/sbin/nologin "$SERVICE_USER"
fi
# an INA219 power monitor is read over I2C
getent group i2c >/dev/null 2>&1 && usermod -a -G i2c "$SERVICE_USER"
if command -v runuser >/dev/null 2>&1 && ! runuser -u "$SERVICE_USER" -- test -x "$PREFIX/bin/edgefl-device"; then
    echo "install.sh: warning: user $SERVICE_USER cannot run $PREFIX/bin/edgefl-device (a home folder is private): unpack the bundle under /opt instead" >&2
fi
mkdir -p /etc/edgefl
if [ ! -e /etc/edgefl/device.env ]; then
    install -m 0640 -o root -g "$SERVICE_USER" "$HERE/device.env" /etc/edgefl/device.env
    echo "wrote /etc/edgefl/device.env: set EDGEFL_ID, EDGEFL_BROKER, EDGEFL_DATA, ... there"
else
    echo "kept /etc/edgefl/device.env"
fi
sed -e "s|@PREFIX@|$PREFIX|g" -e "s|@USER@|$SERVICE_USER|g" "$HERE/edgefl-device.service" > /etc/systemd/system/edgefl-device.service
chmod 644 /etc/systemd/system/edgefl-device.service
command -v systemctl >/dev/null 2>&1 && systemctl daemon-reload || true
echo "installed /etc/systemd/system/edgefl-device.service; after editing /etc/edgefl/device.env start it with:"
echo "  sudo systemctl enable --now edgefl-device && journalctl -u edgefl-device -f"

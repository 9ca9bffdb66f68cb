# Shared by the scripts that run on the device host (bench/device_issue5.sh,
# bench/device_amx_order.sh, tools/gen_amx_order_fixtures.sh): source it, then
#
#   bin="$(device_bundle "$bin")"   the carried .device-bin/, unpacked to /tmp/rustorch-device-bin
#                                   when tools/device_bundle.sh stored it xz-compressed
#                                   (DEVICE_BUNDLE_XZ=1; python3's lzma, the host has no xz),
#                                   executables marked; prints the folder to use
#   device_gguf "$bin"              makes `import gguf` work (the carried wheel into
#                                   /tmp/rustorch-site, on PYTHONPATH) where the host lacks it

device_bundle() {
    local bin="$1"
    if compgen -G "$bin/*.xz" >/dev/null || compgen -G "$bin/*/*.xz" >/dev/null; then
        rm -rf /tmp/rustorch-device-bin
        cp -r "$bin" /tmp/rustorch-device-bin
        bin=/tmp/rustorch-device-bin
        find "$bin" -name '*.xz' -print0 | xargs -0 python3 -c '
import lzma, shutil, sys
for f in sys.argv[1:]:
    with lzma.open(f) as src, open(f[:-3], "wb") as dst:
        shutil.copyfileobj(src, dst)'
        find "$bin" -name '*.xz' -delete
    fi
    chmod +x "$bin/rustorch-cli" "$bin"/llama-*/llama-* "$bin"/llama-*/llamacpp-* "$bin/time" "$bin/rustorch_core_tests" 2>/dev/null || true
    echo "$bin"
}

device_gguf() {
    local bin="$1" site=/tmp/rustorch-site
    if ! python3 -c 'import gguf' 2>/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" "$bin"/whl/*.whl >&2
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    fi
}

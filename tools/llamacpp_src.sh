# shellcheck shell=bash
# Sourced by tools/build_llamacpp.sh and tools/build_llamacpp_device.sh (not run on its own).
#
# llamacpp_src CACHE VERSION: makes CACHE/src hold llama.cpp's sources as the PyPI package
# `llama-cpp-python` VERSION vendors them (fetched once with pip), with the one source change
# that the benchmarks need (test-backend-ops' thread count from RUSTORCH_LLAMACPP_THREADS).
# Progress goes to stderr.
llamacpp_src() {
    local cache="$1" version="$2"
    mkdir -p "$cache"
    if [ ! -d "$cache/src" ]; then
        echo "fetching llama-cpp-python $version sources with pip..." >&2
        # Only llama-cpp-python itself as a source archive; its build tools may be wheels.
        python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
            "llama-cpp-python==$version" -d "$cache/dl" >&2
        tar xzf "$cache"/dl/llama_cpp_python-"$version".tar.gz -C "$cache"
        mv "$cache/llama_cpp_python-$version/vendor/llama.cpp" "$cache/src"
        rm -rf "$cache/llama_cpp_python-$version" "$cache/dl"
    fi
    # The one source change: test-backend-ops runs the CPU backend with half the
    # hardware threads (1 on a 2-core machine); let RUSTORCH_LLAMACPP_THREADS set
    # the count so that benchmarks compare both libraries at the same threads.
    local tbo="$cache/src/tests/test-backend-ops.cpp"
    if ! grep -q RUSTORCH_LLAMACPP_THREADS "$tbo"; then
        sed -i 's|ggml_backend_set_n_threads_fn(backend.get(), std::max<int>(1, N_THREADS/2));|ggml_backend_set_n_threads_fn(backend.get(), getenv("RUSTORCH_LLAMACPP_THREADS") ? atoi(getenv("RUSTORCH_LLAMACPP_THREADS")) : std::max<int>(1, N_THREADS/2));|' "$tbo"
        grep -q RUSTORCH_LLAMACPP_THREADS "$tbo" || { echo "could not patch the thread count in $tbo" >&2; return 1; }
    fi
}

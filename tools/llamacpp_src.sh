# shellcheck shell=bash
# Sourced by tools/build_llamacpp.sh and tools/build_llamacpp_device.sh (not run on its own).
#
# llamacpp_src CACHE VERSION: makes CACHE/src hold llama.cpp's sources as the PyPI package
# `llama-cpp-python` VERSION vendors them (fetched once with pip), with the one source change
# that the benchmarks need (test-backend-ops' thread count from RUSTORCH_LLAMACPP_THREADS), and
# one extra tool: tools/llamacpp_greedy.cpp as CACHE/src/tools/rustorch-greedy (cmake target
# llamacpp-greedy, for tools/llamacpp_diff.py), re-copied whenever the repo's copy changed.
# Progress goes to stderr.
#
# llamacpp_greedy_current CACHE BIN: true when BIN/llamacpp-greedy was built from the repo's
# tools/llamacpp_greedy.cpp as it is now (so that a build script's cache check sees an edit).
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
    # The greedy program as one more tool of the tree. Files are rewritten only when their
    # content changed, so that make rebuilds the tool in every build dir exactly when needed.
    local here gdir
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    gdir="$cache/src/tools/rustorch-greedy"
    mkdir -p "$gdir"
    cmp -s "$here/llamacpp_greedy.cpp" "$gdir/llamacpp_greedy.cpp" \
        || cp "$here/llamacpp_greedy.cpp" "$gdir/llamacpp_greedy.cpp"
    local cml
    cml='# Written by tools/llamacpp_src.sh (RusTorch): the greedy program of tools/llamacpp_diff.py.
set(TARGET llamacpp-greedy)
add_executable(${TARGET} llamacpp_greedy.cpp)
target_link_libraries(${TARGET} PRIVATE llama ${CMAKE_THREAD_LIBS_INIT})
target_compile_features(${TARGET} PRIVATE cxx_std_17)'
    [ "$(cat "$gdir/CMakeLists.txt" 2>/dev/null)" = "$cml" ] || printf '%s\n' "$cml" > "$gdir/CMakeLists.txt"
    local tcml="$cache/src/tools/CMakeLists.txt"
    grep -qx 'add_subdirectory(rustorch-greedy)' "$tcml" || printf '\nadd_subdirectory(rustorch-greedy)\n' >> "$tcml"
}

llamacpp_greedy_current() {
    local cache="$1" bin="$2" here
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    [ -x "$bin/llamacpp-greedy" ] \
        && cmp -s "$here/llamacpp_greedy.cpp" "$cache/src/tools/rustorch-greedy/llamacpp_greedy.cpp" \
        && [ "$bin/llamacpp-greedy" -nt "$cache/src/tools/rustorch-greedy/llamacpp_greedy.cpp" ]
}

//! Kernel sources to machine code (CUBIN, `compile_cubin`) or PTX
//! (`compile`) with NVRTC, for one GPU architecture, cached on disk: the key
//! hashes the source (with the shared header), the options, the
//! architecture and NVRTC's version, so a second start compiles nothing and
//! any change compiles afresh. The backend loads CUBIN: PTX would leave the
//! driver to translate it to machine code at every start its own cache
//! misses (over a minute for all modules, on one thread), and a PTX newer
//! than the driver does not load at all; PTX stays the fallback.
//!
//! The cache lives in `$RUSTORCH_CUDA_CACHE`, else
//! `$XDG_CACHE_HOME/rustorch/cuda-kernels`, else
//! `~/.cache/rustorch/cuda-kernels`. Writes go through a temporary file and
//! a rename, so concurrent processes never read half a file.

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use std::path::PathBuf;

/// Options every kernel is compiled with: IEEE division and square root
/// (results close to the CPU's), no flush of subnormals.
const OPTIONS: &[&str] = &["--std=c++17", "--prec-div=true", "--prec-sqrt=true", "--ftz=false"];

/// The source NVRTC sees: the module with the shared headers inlined
/// (NVRTC has no file system to include them from).
pub fn full_source(src: &str) -> String {
    src.replace("#include \"common.cuh\"", crate::COMMON_HEADER)
        .replace("#include \"rows.cuh\"", crate::ROWS_HEADER)
        .replace("#include \"norm_products.cuh\"", crate::NORM_PRODUCTS_HEADER)
        .replace("#include \"mmq.cuh\"", crate::MMQ_HEADER)
}

/// Where compiled kernels are kept.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("RUSTORCH_CUDA_CACHE") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("rustorch").join("cuda-kernels"))
}

/// NVRTC's version, or why it cannot be loaded.
pub fn nvrtc_version() -> Result<(i32, i32), String> {
    // SAFETY: only opens the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("NVRTC (libnvrtc.so) not found: install the CUDA toolkit or the nvidia-cuda-nvrtc wheel and put its lib/ on LD_LIBRARY_PATH".into());
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-parameters, with the library loaded (checked above).
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("NVRTC: {r:?}"));
    }
    Ok((major, minor))
}

/// FNV-1a, 64 bits: a stable key (std's hasher may change between Rust
/// versions, which would only cost a recompile, but a file name should not
/// depend on the compiler that built the program).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `name`'s PTX for `arch` (`compute_90`), from the cache when there.
pub fn compile(name: &str, src: &str, arch: &str) -> Result<Ptx, String> {
    let source = full_source(src);
    let (major, minor) = nvrtc_version()?;
    let version = format!("{major}.{minor}");
    let key = fnv1a(&[
        source.as_bytes(),
        OPTIONS.join(" ").as_bytes(),
        arch.as_bytes(),
        version.as_bytes(),
    ]);
    let file = cache_dir().map(|d| d.join(format!("{name}-{arch}-{key:016x}.ptx")));
    if let Some(f) = &file {
        if let Ok(text) = std::fs::read_to_string(f) {
            return Ok(Ptx::from_src(text));
        }
    }
    let ptx = compile_uncached(name, &source, arch)?;
    if let Some(f) = &file {
        // A cache that cannot be written only costs the next start a compile.
        let _ = write_atomically(f, ptx.to_src().as_bytes());
    }
    Ok(ptx)
}

/// `name`'s machine code for `sm` (`sm_90`), from the cache when there.
pub fn compile_cubin(name: &str, src: &str, sm: &str) -> Result<Vec<u8>, String> {
    let source = full_source(src);
    let (major, minor) = nvrtc_version()?;
    let version = format!("{major}.{minor}");
    let key = fnv1a(&[
        source.as_bytes(),
        OPTIONS.join(" ").as_bytes(),
        sm.as_bytes(),
        version.as_bytes(),
    ]);
    let file = cache_dir().map(|d| d.join(format!("{name}-{sm}-{key:016x}.cubin")));
    if let Some(f) = &file {
        if let Ok(bytes) = std::fs::read(f) {
            return Ok(bytes);
        }
    }
    let cubin = compile_cubin_uncached(name, &source, sm)?;
    if let Some(f) = &file {
        let _ = write_atomically(f, &cubin);
    }
    Ok(cubin)
}

/// NVRTC straight to machine code for `sm` (`sm_90`), without the cache.
pub fn compile_cubin_uncached(name: &str, full_source: &str, sm: &str) -> Result<Vec<u8>, String> {
    use cudarc::nvrtc::sys;
    use std::ffi::{c_char, CString};
    nvrtc_version()?;
    let fail = |what: &str, r: sys::nvrtcResult| format!("kernels/{name}.cu: NVRTC {what}: {r:?}");
    let src = CString::new(full_source).map_err(|_| format!("kernels/{name}.cu holds a NUL byte"))?;
    let file_name = CString::new(format!("{name}.cu")).expect("no NUL in a module name");
    let mut options: Vec<CString> = OPTIONS
        .iter()
        .map(|o| CString::new(*o).expect("no NUL in an option"))
        .collect();
    options.push(CString::new(format!("--gpu-architecture={sm}")).map_err(|_| "bad architecture".to_string())?);
    let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: NVRTC's C API with NUL-terminated strings that outlive the
    // program; the program is destroyed on every path below.
    unsafe {
        let r = sys::nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            file_name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        );
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(fail("could not create the program", r));
        }
        let result = (|| {
            let r = sys::nvrtcCompileProgram(prog, option_ptrs.len() as i32, option_ptrs.as_ptr());
            if r != sys::nvrtcResult::NVRTC_SUCCESS {
                let mut n = 0usize;
                let mut log = String::new();
                if sys::nvrtcGetProgramLogSize(prog, &mut n) == sys::nvrtcResult::NVRTC_SUCCESS && n > 1 {
                    let mut buf = vec![0u8; n];
                    if sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr().cast()) == sys::nvrtcResult::NVRTC_SUCCESS {
                        log = String::from_utf8_lossy(&buf[..n - 1]).into_owned();
                    }
                }
                return Err(format!("kernels/{name}.cu does not compile for {sm}:\n{log}"));
            }
            let mut n = 0usize;
            let r = sys::nvrtcGetCUBINSize(prog, &mut n);
            if r != sys::nvrtcResult::NVRTC_SUCCESS || n == 0 {
                return Err(fail("gave no machine code", r));
            }
            let mut cubin = vec![0u8; n];
            let r = sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast());
            if r != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(fail("could not hand over the machine code", r));
            }
            Ok(cubin)
        })();
        let _ = sys::nvrtcDestroyProgram(&mut prog);
        result
    }
}

/// Compiles without the cache (what CI's compile check runs).
pub fn compile_uncached(name: &str, full_source: &str, arch: &str) -> Result<Ptx, String> {
    let mut options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    let opts = CompileOptions {
        options,
        name: Some(format!("{name}.cu")),
        ..Default::default()
    };
    compile_ptx_with_opts(full_source, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            format!(
                "kernels/{name}.cu does not compile for {arch}:\n{}",
                log.to_string_lossy()
            )
        }
        other => format!("kernels/{name}.cu: NVRTC failed: {other:?}"),
    })
}

fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(tmp, path)
}

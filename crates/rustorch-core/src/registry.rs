//! Where backends come from: each backend crate (rustorch-cpu, and later
//! rustorch-cuda, rustorch-wgpu, ...) adds a `BackendProvider` to
//! `BACKEND_PROVIDERS`, and `Executor::new` builds its device chain from
//! every provider linked into the program. Which crates are linked is the
//! `rustorch` facade's choice (its `cuda`, `wgpu`, `opencl` features), so
//! core never names a backend; and a provider enumerates its devices at
//! run time, so a binary built with a GPU backend still runs where there
//! is no GPU (the provider reports why it has none).
//!
//! Registration is a link-time list (`linkme`): a crate that is linked
//! registers itself, without an init call a user could forget. A program
//! that links only `rustorch-core` has no backend, and every op says so.

use crate::backend::Backend;
use std::sync::Arc;

/// A kind of backend and how to find its devices.
pub trait BackendProvider: Sync {
    /// A short name: `cpu`, `cuda`, `wgpu`, `opencl`.
    fn name(&self) -> &'static str;

    /// Routing priority: the executor tries higher ones first. The CPU,
    /// the host and every device's last resort, is 0; accelerators are
    /// above it.
    fn priority(&self) -> i32;

    /// The devices of this kind present and usable here, best first, or
    /// why there are none (no driver, no device): a reason to show, not a
    /// failure of the program.
    fn devices(&self) -> Result<Vec<Arc<dyn Backend>>, String>;
}

/// Every provider linked into this program, in no particular order
/// (`providers` sorts them).
#[linkme::distributed_slice]
pub static BACKEND_PROVIDERS: [&'static dyn BackendProvider];

/// The linked providers, highest priority first (ties by name).
pub fn providers() -> Vec<&'static dyn BackendProvider> {
    let mut p: Vec<&'static dyn BackendProvider> = BACKEND_PROVIDERS.iter().copied().collect();
    p.sort_by(|a, b| b.priority().cmp(&a.priority()).then(a.name().cmp(b.name())));
    p
}

/// What enumerating every provider found.
#[derive(Default)]
pub struct Found {
    /// Usable devices, in routing order (highest priority first).
    pub backends: Vec<Arc<dyn Backend>>,
    /// Providers that found no device, with why.
    pub unavailable: Vec<(&'static str, String)>,
}

/// Enumerates every linked provider's devices.
pub fn enumerate() -> Found {
    let mut found = Found::default();
    for p in providers() {
        match p.devices() {
            Ok(devices) if devices.is_empty() => found.unavailable.push((p.name(), "no device found".into())),
            Ok(devices) => found.backends.extend(devices),
            Err(why) => found.unavailable.push((p.name(), why)),
        }
    }
    found
}
